"""Forged sizes are refused before they cost memory: peak RSS of each refusal, measured in a fresh process."""
import json
import pathlib
import re
import subprocess
import sys


from hilo.log import open_log, updates_topic
from hilo.producer.producer import HiLoProducer
from hilo.schemas.chunks import split
from tests.conftest import producer_config, publish_random, small_model

WORKER = pathlib.Path(__file__).with_name("_bound_worker.py")
MiB = 1 << 20


def _refusal(tmp_path, records):
    """Append `records` after one good version and let a fresh site process follow: (error, MiB its peak RSS grew)."""
    url = f"file://{tmp_path}/log"
    producer = HiLoProducer.open(small_model(), producer_config(run="r", log=url))
    publish_random(producer, 1)
    open_log(url).append(updates_topic("r"), records)
    out = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "log"), "r"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    return r["error"], r["grew_mib"]


def test_a_first_chunk_declaring_3_gib_is_refused_for_a_small_adapter(tmp_path):
    """The adapter's largest legitimate update is ~230 KB: a 3 GiB declaration is refused at the first chunk."""
    head = split(b"x" * 1000, "r", "update", 2)[0]
    forged = [(head[0], b"x" * MiB, head[2] | {"hilo-size": str(3 << 30), "hilo-chunk": f"{i}/3072"})
              for i in range(64)]
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


def _checkpoint_bomb(manifest, inflated: int) -> bytes:
    """A checkpoint record of ~tens of KB whose body declares and inflates to `inflated` bytes (zeros in one bin)."""
    import msgpack
    import zstandard
    from hilo.schemas.framing import _HEADER, KIND_CHECKPOINT, MAGIC, SCHEMA_VERSION
    head = msgpack.packb({"run": "r", "version": 7, "digest": bytes(16), "manifest": manifest.to_dict(),
                          "optimizer": "adamw"},
                         use_bin_type=True)
    # Reopen the map as 10 entries: the 5 above, then params = [bin of zeros], then the rest.
    head = b"\x8a" + head[1:]
    rest = msgpack.packb({"slots": [], "slot_tensors": [], "scalars": {}, "genesis": bytes(16)}, use_bin_type=True)[1:]
    zeros = inflated - len(head) - len(rest) - 6
    params_head = msgpack.packb("params") + b"\x91\xc6" + zeros.to_bytes(4, "big")
    body_len = len(head) + len(params_head) + zeros + len(rest)
    out = __import__("io").BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False) as w:
        w.write(head + params_head)
        block = bytes(1 << 20)
        for _ in range(zeros >> 20):
            w.write(block)
        w.write(bytes(zeros & ((1 << 20) - 1)))
        w.write(rest)
    return _HEADER.pack(MAGIC, SCHEMA_VERSION, KIND_CHECKPOINT, 0, body_len) + out.getvalue()


def test_a_small_checkpoint_record_inflating_to_1_5_gib_is_refused_unread(tmp_path):
    """Was: a new site decompressed it (3.6 GiB peak). Its manifest allows ~2 MB: refused from the first bytes."""
    from hilo.log import checkpoints_topic
    from hilo.producer.lora_params import lora_parameters
    manifest, _ = lora_parameters(small_model())
    bomb = _checkpoint_bomb(manifest, 3 << 29)
    assert len(bomb) < 256 << 10
    url = f"file://{tmp_path}/log"
    log = open_log(url)
    log.create_topics("r")
    log.append(checkpoints_topic("r"), split(bomb, "r", "checkpoint", 7, extra={"hilo-updates-offset": "0"}))
    code = ("import json, resource, sys; from hilo.log import open_log; from hilo.replay.follower import "
            "bootstrap_from_log\nbase = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
            "try:\n    bootstrap_from_log(open_log(sys.argv[1]), 'r'); err = None\nexcept Exception as e:\n    err = "
            "str(e)\nprint(json.dumps({'error': err, 'grew_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / "
            "1024 - base}))")
    out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=300)
    r = json.loads(out.stdout)
    said = r"r.checkpoints offset 0 \(checkpoint v7\): declared decompressed size 16106127\d\d > limit \d+"
    assert r["error"] and re.search(said, r["error"])
    assert r["grew_mib"] < 48, f"peak RSS grew {r['grew_mib']:.0f} MiB"
