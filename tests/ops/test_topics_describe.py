"""`hilo topics describe` counts what a reader gets: the same run on the file log and on Kafka describes the same."""
import json

import pytest

from hilo.ops.cli import main
from hilo.producer.producer import HiLoProducer
from hilo.schemas.signing import generate
from tests.conftest import KAFKA_URL, new_run, producer_config, publish_random, small_model


def _same_run(url: str, run: str, keys, chunk_bytes: int) -> None:
    """Six versions, checkpoints every two (all kept), a key rotation after v3, messages in chunks of `chunk_bytes`."""
    producer = HiLoProducer.open(small_model(), producer_config(
        run=run, log=url, codec="spar", checkpoint_every=2, keep_checkpoints=10, signing_key=str(keys[0][0]),
        chunk_bytes=chunk_bytes))
    try:
        publish_random(producer, 3)
        producer.rotate_key(str(keys[1][0]))
        publish_random(producer, 3, seed=1)
    finally:
        producer.close()


def _describe(url: str, run: str, capsys) -> dict:
    capsys.readouterr()
    assert main(["topics", "describe", "--log", url, "--run", run, "--json"]) == 0
    return {r["topic"].rsplit(".", 1)[1]: r for r in json.loads(capsys.readouterr().out)}


@pytest.mark.kafka
@pytest.mark.parametrize("chunk_bytes", [900 << 10, 4096], ids=["one-chunk", "chunked"])
def test_describe_on_kafka_gives_the_file_logs_versions_and_counts(tmp_path, capsys, chunk_bytes):
    """Was, on Kafka: `versions 1..None` (the last offset is a transaction marker) and `12 records` for 6 versions."""
    keys = [generate(tmp_path / n) for n in ("old", "new")]
    file_url, run = f"file://{tmp_path}/log", new_run("describe")
    _same_run(file_url, run, keys, chunk_bytes)
    _same_run(KAFKA_URL, run, keys, chunk_bytes)
    on_file, on_kafka = _describe(file_url, run, capsys), _describe(KAFKA_URL, run, capsys)
    for topic in ("updates", "checkpoints"):
        fields = ("oldest_version", "newest_version", "records", "messages")
        assert [on_kafka[topic].get(f) for f in fields] == [on_file[topic].get(f) for f in fields], (topic, on_file,
                                                                                                     on_kafka)
        # Kafka's offsets are not a count: its markers take offsets no reader gets
        assert on_kafka[topic]["end_offset"] - on_kafka[topic]["begin_offset"] > on_kafka[topic]["records"]
        assert on_file[topic]["end_offset"] - on_file[topic]["begin_offset"] == on_file[topic]["records"]
    assert (on_file["updates"]["oldest_version"], on_file["updates"]["newest_version"]) == (1, 6)
    assert on_file["updates"]["messages"] == 7  # six updates and the key record
    assert (on_file["checkpoints"]["oldest_version"], on_file["checkpoints"]["newest_version"]) == (0, 6)
    if chunk_bytes < 900 << 10:
        assert on_file["checkpoints"]["records"] > on_file["checkpoints"]["messages"]  # the checkpoints are chunked
    main(["topics", "describe", "--log", KAFKA_URL, "--run", run])
    assert "messages), versions 1..6," in capsys.readouterr().out
