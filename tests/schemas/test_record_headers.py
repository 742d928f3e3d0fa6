"""Headers are parsed once, by one rule: a value that is not canonical is absent, never an exception or a guess."""
import re

import pytest

from hilo.schemas import headers as H
from hilo.schemas.chunks import split


def test_headers_a_writer_sets_parse_back_to_their_values():
    (_, _, raw), = split(b"x" * 10, "run-1", "update", 7,
                         extra={H.DIGEST: "ab" * 16, H.LOG_BYTES: "1234", H.LAG: "0.0012"})
    h = H.RecordHeaders.of(raw)
    assert (h.run, h.kind, h.version, h.chunk, h.digest, h.log_bytes, h.lag) == ("run-1", "update", 7, (0, 1),
                                                                                 "ab" * 16, 1234, 0.0012)
    assert h.first_chunk and h.last_chunk and h.of_run("run-1") and not h.of_run("run-2")


@pytest.mark.parametrize("lag", [0.0, 4.55855e-05, 1 / 3, 0.9999999999999999, 2.5e-300])
def test_the_lag_header_reads_back_exactly_in_one_form(lag):
    text = H.lag_text(lag)
    assert H.RecordHeaders.of({H.LAG: text}).lag == lag
    assert re.fullmatch(r"\d\.\d{16}e[+-]\d{2,3}", text)


@pytest.mark.parametrize("old", ["4.55855e-05", "0.0012", "0"])
def test_a_lag_header_of_earlier_writers_still_reads(old):
    assert H.RecordHeaders.of({H.LAG: old}).lag == float(old)


@pytest.mark.parametrize("name,value,field", [
    (H.VERSION, "-1", "version"), (H.VERSION, "1e3", "version"), (H.VERSION, "٣", "version"),  # an Arabic-Indic digit
    (H.VERSION, "9" * 40, "version"), (H.VERSION, "", "version"), (H.VERSION, " 3", "version"),
    (H.LOG_BYTES, "12x", "log_bytes"), (H.UPDATES_OFFSET, "0x10", "updates_offset"),
    (H.DIGEST, "AB" * 16, "digest"), (H.DIGEST, "ab" * 15, "digest"), (H.GENESIS, "zz" * 16, "genesis"),
    (H.CHUNK, "3/3", "chunk"), (H.CHUNK, "1/", "chunk"), (H.CHUNK, "0/0", "chunk"), (H.CHUNK, "a/b", "chunk"),
    (H.LAG, "nan", "lag"), (H.LAG, "inf", "lag"), (H.LAG, "fast", "lag"),
])
def test_a_garbled_value_is_absent(name, value, field):
    assert getattr(H.RecordHeaders.of({name: value}), field) is None


def test_no_headers_at_all_parse_to_nothing():
    h = H.RecordHeaders.of(None)
    assert h == H.RecordHeaders() and not h.first_chunk and not h.last_chunk and not h.of_run("r")


def test_the_reassembler_reads_headers_by_the_same_rule():
    """A version written with a non-ASCII digit was taken as v3 by str.isdigit() + int(); now it is malformed."""
    from hilo.schemas.chunks import Reassembler, Record
    from hilo.schemas.errors import MalformedMessage
    (key, value, raw), = split(b"payload", "r", "update", 3)
    assert Reassembler("r", "t").feed(Record(0, key, value, raw)).version == 3
    with pytest.raises(MalformedMessage, match="hilo-version"):
        Reassembler("r", "t").feed(Record(0, key, value, raw | {H.VERSION: "٣"}))
