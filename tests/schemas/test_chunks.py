"""Reassembler: chunks in, whole messages out; every broken sequence is named by offset or discarded."""
import pytest

from hilo.schemas.chunks import Reassembler, Record, split
from hilo.schemas.errors import LimitExceeded, LogError, MalformedMessage
from hilo.schemas.limits import Limits

RUN, TOPIC = "r", "r.updates"


def records(data, version, chunk_bytes=10, start=0, run=RUN):
    """The chunk records of one message at consecutive offsets from `start`."""
    return [Record(start + i, k, v, h) for i, (k, v, h) in enumerate(split(data, run, "update", version, chunk_bytes))]


def feed_all(r, recs):
    return [m for m in (r.feed(rec) for rec in recs) if m is not None]


def test_chunks_reassemble_to_the_message_and_its_offsets():
    data = bytes(range(95))
    out = feed_all(Reassembler(RUN, TOPIC), records(data, 3, start=40))
    assert len(out) == 1
    m = out[0]
    assert (m.data, m.first_offset, m.last_offset, m.version, m.kind) == (data, 40, 49, 3, "update")


def test_checksum_mismatch_names_the_offsets():
    recs = records(b"a" * 30, 1)
    recs[1] = Record(recs[1].offset, recs[1].key, b"b" * 10, recs[1].headers)  # same length, other bytes
    said = r"r.updates offsets 0..2 \(v1\): reassembled 30 bytes do not match header size 30 / checksum"
    with pytest.raises(MalformedMessage, match=said):
        feed_all(Reassembler(RUN, TOPIC), recs)


def test_too_many_chunks_are_refused_at_the_first_record():
    recs = records(b"x" * 50, 1)  # 5 chunks
    with pytest.raises(MalformedMessage,
                       match=r"r.updates offset 0: header 'hilo-chunk' = '0/5', expected i/n with 0 <= i < n <= 4"):
        Reassembler(RUN, TOPIC, Limits(max_chunks=4)).feed(recs[0])


def test_a_declared_size_over_the_limit_is_refused_before_buffering():
    recs = records(b"x" * 50, 7)
    with pytest.raises(LimitExceeded, match=r"r.updates offset 0 \(v7\): message of 50 bytes > limit 49"):
        Reassembler(RUN, TOPIC, Limits(max_frame_bytes=49)).feed(recs[0])


def test_interleaved_sequences_drop_the_broken_one_and_keep_the_whole_one():
    """A writer died after 2 of 3 chunks of v5; the restarted writer sent v5 again, whole."""
    dead = records(b"d" * 30, 5)[:2]
    whole = records(b"w" * 30, 5, start=2)
    r = Reassembler(RUN, TOPIC)
    out = feed_all(r, dead + whole)
    assert [m.data for m in out] == [b"w" * 30] and r.discarded == 1


def test_a_continuation_without_its_beginning_is_discarded():
    recs = records(b"z" * 30, 2)
    r = Reassembler(RUN, TOPIC)
    assert feed_all(r, recs[1:]) == [] and r.discarded == 0  # started mid-message: nothing buffered, nothing lost
    assert [m.data for m in feed_all(r, records(b"y" * 30, 3, start=3))] == [b"y" * 30]


def test_mixed_chunks_of_two_messages_are_discarded_not_spliced():
    a, b = records(b"a" * 30, 1), records(b"b" * 30, 2, start=3)
    r = Reassembler(RUN, TOPIC)
    assert feed_all(r, [a[0], b[1], a[1], a[2]]) == []  # b[1] breaks a's sequence; a's tail has no beginning
    assert r.discarded == 1


@pytest.mark.parametrize("headers,error", [
    ({}, r"r.updates offset 0: not a hilo-sync record"),
    ({"hilo-run": "other", "hilo-chunk": "0/1"}, r"r.updates offset 0: record of run 'other' in the topic of run 'r'"),
])
def test_foreign_records_are_named(headers, error):
    with pytest.raises(LogError, match=error):
        Reassembler(RUN, TOPIC).feed(Record(0, None, b"x", headers))


def test_chunks_past_the_declared_size_are_refused_at_the_overflowing_chunk():
    """A sequence declaring 1,000 bytes whose chunks carry more: refused at the chunk that overflows."""
    recs = [Record(i, b"1", b"x" * 600, h) for i, (_, _, h) in enumerate(split(b"y" * 1000, RUN, "update", 1, 500))]
    r = Reassembler(RUN, TOPIC)
    with pytest.raises(MalformedMessage,
                       match=r"r.updates offset 1 \(v1\): chunk 1/2 brings the message past its declared 1000 bytes"):
        feed_all(r, recs)
    assert r.buffered == 0 and r.parts == []


def test_a_caller_bound_is_enforced_at_the_first_chunk():
    recs = records(b"x" * 5000, 2, chunk_bytes=1000)
    with pytest.raises(LimitExceeded, match=r"r.updates offset 0 \(v2\): message of 5000 bytes > limit 4096"):
        Reassembler(RUN, TOPIC, max_bytes=4096).feed(recs[0])
