"""Forged sizes are refused before they cost memory: peak RSS of each refusal, measured in a fresh process."""
import json
import pathlib
import subprocess
import sys

import pytest

from hilo.log import open_log, updates_topic
from hilo.producer.producer import HiLoProducer
from hilo.schemas.chunks import split
from tests.conftest import producer_config, publish_random, small_model

WORKER = pathlib.Path(__file__).with_name("_bound_worker.py")
MiB = 1 << 20


def _refusal(tmp_path, records):
    """Append `records` after one good version and let a fresh site process follow: (error, MiB its peak RSS grew)."""
    url = f"file://{tmp_path}/log"
    producer = HiLoProducer(small_model(), producer_config(run="r", log=url))
    publish_random(producer, 1)
    open_log(url).append(updates_topic("r"), records)
    out = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "log"), "r"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    return r["error"], r["grew_mib"]


def test_a_first_chunk_declaring_3_gib_is_refused_for_a_small_adapter(tmp_path):
    """The adapter's largest legitimate update is ~230 KB: a 3 GiB declaration is refused at the first chunk."""
    head = split(b"x" * 1000, "r", "update", 2)[0]
    forged = [(head[0], b"x" * MiB, head[2] | {"hilo-size": str(3 << 30), "hilo-chunk": f"{i}/3072"}) for i in range(64)]
    error, grew = _refusal(tmp_path, forged)
    assert error and "message of 3221225472 bytes > limit" in error
    assert grew < 48, f"peak RSS grew {grew:.0f} MiB"


def test_chunks_far_past_a_declared_1000_bytes_are_refused_at_once(tmp_path):
    """175 MiB of chunks under a header declaring 1,000 bytes: the old reassembler buffered all of it."""
    head = split(b"x" * 1000, "r", "update", 2)[0]
    forged = [(head[0], b"x" * MiB, head[2] | {"hilo-chunk": f"{i}/175"}) for i in range(175)]
    error, grew = _refusal(tmp_path, forged)
    assert error and "brings the message past its declared 1000 bytes" in error
    assert grew < 48, f"peak RSS grew {grew:.0f} MiB"
