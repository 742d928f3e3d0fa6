"""Subprocess side of test_fuzz's checkpoint/snapshot/chunk fuzzing: a fresh process, so peak RSS growth is its own.

    python _fuzz_worker.py KIND N SEED DIR   ->  {"tried", "rejected", "accepted", "grew_mib"}
KIND: checkpoint (record bytes -> verified replica), snapshot (files in DIR -> SnapshotStore.load),
chunks (mutated chunk headers -> Reassembler). Every refusal must be a HiloError naming the input; an
accepted input must be exactly the original state (checkpoints, snapshots) or message (chunks).
"""
import json
import random
import resource
import shutil
import sys

from hilo.replica.synthetic import GradientStream, initial_params, qwen3_manifest
from hilo.producer.update_builder import UpdateBuilder
from hilo.replay.snapshot import SnapshotStore
from hilo.replica.codecs import Budget, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.schemas.chunks import Reassembler, Record, split
from hilo.schemas.errors import HiloError
from hilo.schemas.framing import HEADER_BYTES
from hilo.schemas.position import Position
from hilo.schemas.records import decode_record

kind, n, seed, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(seed)
manifest = qwen3_manifest("tiny", rank=8)
replica = PolicyReplica.genesis("fuzz", manifest, initial_params(manifest, 0), "adamw")
UpdateBuilder(replica, make_encoder("dense", manifest, Budget())).step(GradientStream(manifest, 1).next(), {"lr": 1e-3})
ckpt = replica.checkpoint().to_bytes()
WEIRD_HEADERS = ["", "x", "-1", "0/0", "1/1", "5/3", "0/999999999", "99999999999999999999", "0/1/2", " 1", "1e3", "٣"]


def mutate_bytes(data: bytes) -> bytes:
    """Flip bits, truncate, splice junk, or forge the declared size."""
    c = rng.random()
    if c < 0.4:
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if c < 0.6:
        return data[:rng.randrange(len(data))]
    if c < 0.8:
        b = bytearray(data)
        b[8:16] = rng.choice([2**62, 2**40, 2**31, len(data) * 100]).to_bytes(8, "little")
        return bytes(b)
    return data[:HEADER_BYTES] + rng.randbytes(rng.randrange(400))


def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


base, rejected, accepted = rss(), 0, 0
store = SnapshotStore(f"{work}/snap")
store.save(replica, Position(1))
good_files = {p.name: p.read_bytes() for p in (store.path).iterdir()}
msg_records = [Record(i, k, v, h)
               for i, (k, v, h) in enumerate(split(ckpt, "fuzz", "checkpoint", 1, len(ckpt) // 5 + 1))]
for i in range(n):
    what = f"fuzz#{i}"
    try:
        if kind == "checkpoint":
            got = PolicyReplica.from_checkpoint(decode_record(mutate_bytes(ckpt), what), what)
            assert got.digest == replica.digest, "an accepted checkpoint must be the original state"
        elif kind == "snapshot":
            shutil.rmtree(store.path, ignore_errors=True)
            store.path.mkdir()
            for name, data in good_files.items():
                (store.path / name).write_bytes(data)
            target = rng.choice(sorted(good_files))
            data = good_files[target]
            (store.path / target).write_bytes(mutate_bytes(data) if target.endswith(".ckpt") else
                                              rng.choice([data[:rng.randrange(len(data))], b"{}", b"[1]",
                                                          b'{"next_offset": "x"}',
                                                          data.replace(b'"next_offset": 1', b'"next_offset": -1'),
                                                          rng.randbytes(30)]))
            got, pos = store.load()
            assert got.digest == replica.digest, "an accepted snapshot must be the original state"
        else:
            r = Reassembler("fuzz", "fuzz.checkpoints")
            recs = list(msg_records)
            j = rng.randrange(len(recs))
            h = dict(recs[j].headers)
            h[rng.choice(sorted(h) + ["hilo-extra"])] = rng.choice(WEIRD_HEADERS + [str(rng.randrange(2**63))])
            recs[j] = Record(recs[j].offset, recs[j].key, recs[j].value, h)
            out = [m for m in (r.feed(x) for x in recs) if m is not None]
            assert all(m.data == ckpt for m in out), "a reassembled message must be the original bytes"
        accepted += 1
    except HiloError as e:
        named = {"checkpoint": what, "snapshot": f"snapshot {store.path}", "chunks": "fuzz.checkpoints offset "}[kind]
        assert named in str(e), f"error does not name the input: {e}"
        rejected += 1
print(json.dumps({"tried": n, "rejected": rejected, "accepted": accepted, "grew_mib": rss() - base}))
