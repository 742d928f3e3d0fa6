"""`hilo bench fuzz`: mutated, truncated and random inputs through every decoder a site runs; each is refused by name or
accepted as exactly the original.

    hilo bench fuzz [--scale 1.0] [--seed 0] [--out DIR] [--json]

Four kinds, each in a fresh process (`python -m hilo.ops.bench.fuzz --worker KIND N SEED DIR`), so its peak RSS
growth is its own; the counts are at --scale 1 (tests/schemas/test_fuzz.py runs 0.1):
1. updates (40,000): update messages of every codec with bytes flipped, truncated, replaced by junk, a forged
   declared size (a zip bomb), or one field of the decoded body changed (type, value, shape, length) and framed
   again, through decode + apply on a replica. A refusal must leave the replica's digest (kept and recomputed) where
   it was; an accepted message must be one of the valid next versions.
2. checkpoints (30,000): a checkpoint record's bytes mutated, decoded and loaded as a replica.
3. snapshots (10,000): one file of a site's snapshot folder mutated (the checkpoint's bytes, or the position file
   replaced), loaded by SnapshotStore.
4. chunk-headers (20,000): one header of a chunked checkpoint's records replaced by a weird value, fed to a Reassembler.
Every refusal must be a HiloError whose text names the input (the record, the snapshot folder, the topic and
offset); anything else is counted as "unnamed". An accepted checkpoint or snapshot must be the original state, a
reassembled message the original bytes. Results: fuzz.json in --out (default ~/.cache/hilo-sync/bench/fuzz-TIME),
per kind: tried, rejected, accepted, unnamed, mutated (updates), accepted_wrong, peak RSS growth, seconds. Exit 0
only when every refusal was named, nothing was mutated or wrongly accepted, more than 90% of the updates and 30% of
each other kind were refused, and peak RSS grew less than 256 MiB (updates) or 64 MiB (each other kind): forged
sizes must be refused before anything is allocated.
"""
import argparse
import dataclasses
import json
import pathlib
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import msgpack
import zstandard

from hilo.ops.bench.report import results_dir, save
from hilo.producer.update_builder import UpdateBuilder
from hilo.replay.snapshot import SnapshotStore
from hilo.replica.codecs import CODECS, Budget, make_encoder
from hilo.replica.replica import PolicyReplica
from hilo.replica.synthetic import GradientStream, initial_params, qwen3_manifest
from hilo.schemas.chunks import Reassembler, Record, split
from hilo.schemas.errors import ConfigError, HiloError
from hilo.schemas.framing import HEADER_BYTES, KIND_UPDATE, frame
from hilo.schemas.options import opt
from hilo.schemas.position import Position
from hilo.schemas.records import decode_record

RUN = "fuzz"
KINDS = {"updates": 40_000, "checkpoints": 30_000, "snapshots": 10_000, "chunk-headers": 20_000}  # inputs at --scale 1
# What `ok` asks of each kind: the share refused (the rest are harmless mutations, e.g. of `meta`) and the peak RSS
# growth allowed (a forged size that allocated before it was checked would blow far past it).
MIN_REJECTED = {"updates": 0.9, "checkpoints": 0.3, "snapshots": 0.3, "chunk-headers": 0.3}
MAX_GROWTH_MIB = {"updates": 256, "checkpoints": 64, "snapshots": 64, "chunk-headers": 64}
EXAMPLES = 5  # findings quoted per kind in the results, enough to start debugging from

WEIRD = [None, True, -1, 0, 2**40, 2**64 - 1, 1e308, float("nan"), float("inf"), "", "x" * 600, b"", b"\0" * 7,
         [], {}, [1, 2], {"i": 0}, "dense", "muon", -2**63]
WEIRD_HEADERS = ["", "x", "-1", "0/0", "1/1", "5/3", "0/999999999", "99999999999999999999", "0/1/2", " 1", "1e3", "٣"]


@dataclasses.dataclass(frozen=True)
class FuzzConfig:
    """How many inputs `hilo bench fuzz` tries and which; checked at construction. Each field's help is in its metadata
    (`hilo bench fuzz --help`, docs/cli.md)."""

    scale: float = opt(1.0, "multiplies every kind's count: 40,000 updates, 30,000 checkpoints, 10,000 snapshots and "
                            "20,000 chunk headers at 1 (the test suite runs 0.1)")
    seed: int = opt(0, "which mutations (each kind draws from its own generator seeded with it)")

    def __post_init__(self):
        if not self.scale > 0:
            raise ConfigError(f"FuzzConfig.scale = {self.scale}: must be > 0")

    def counts(self) -> dict:
        """{kind: inputs tried} at this scale (at least one each)."""
        return {kind: max(1, round(n * self.scale)) for kind, n in KINDS.items()}


# --- the inputs -------------------------------------------------------------------------------------------------

def manifest():
    """The fuzzed replica's shape: two layers of a tiny Qwen3, rank 8 (the test suite's)."""
    return qwen3_manifest("tiny", rank=8)


def genesis(m, optimizer: str = "adamw", run: str = RUN) -> PolicyReplica:
    """A version-0 replica of manifest `m` with seeded initial params."""
    return PolicyReplica.genesis(run, m, initial_params(m, seed=0), optimizer)


def valid_messages(m, grads, run: str = RUN) -> dict:
    """{codec: a valid version-1 message}, one per registered codec, all from the same genesis."""
    out = {}
    for codec in CODECS:
        trainer = genesis(m, "adamw", run)
        out[codec] = UpdateBuilder(trainer, make_encoder(codec, m, Budget(0.3))).step(grads.next(), {"lr": 1e-3})
    return out


def decode_body(data: bytes) -> dict:
    """The msgpack body of a framed update (its header skipped, zstd undone)."""
    return msgpack.unpackb(zstandard.ZstdDecompressor().decompress(data[HEADER_BYTES:]), raw=False)


def mutate_structure(rng: random.Random, body: dict) -> dict:
    """A copy of `body` with one field changed somewhere: a type, a value, a shape, a length."""
    body = msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False)  # deep copy
    choice = rng.random()
    if choice < 0.35 and body["blocks"]:
        entry = rng.choice(body["blocks"])
        key = rng.choice(sorted(entry))
        v = entry[key]
        if isinstance(v, bytes) and v and rng.random() < 0.6:
            cut = rng.randrange(len(v))
            entry[key] = rng.choice([v[:cut], v + v[:cut + 1], bytes([255]) * len(v),
                                     v[:cut] + b"\x7c\x00" + v[cut + 2:]])
        else:
            entry[key] = rng.choice(WEIRD)
    elif choice < 0.45:
        body["blocks"] = rng.choice([body["blocks"][::-1], body["blocks"] * 2, body["blocks"][1:], [], [{"i": 10**6}]])
    elif choice < 0.6:
        h = body["hparams"]
        h[rng.choice(sorted(h) + ["bogus"])] = rng.choice(WEIRD)
    elif choice < 0.7:
        body["codec_params"][rng.choice(["k", "rank", "budget"])] = rng.choice(WEIRD)
    else:
        body[rng.choice(sorted(body))] = rng.choice(WEIRD)
    return body


def update_mutations(rng: random.Random, messages: dict, n: int):
    """n framed updates, each a mutation of one of `messages` (a mix of byte-level and structural)."""
    framed = {c: m.to_bytes() for c, m in messages.items()}
    for i in range(n):
        data = framed[rng.choice(sorted(framed))]
        kind = i % 6
        if kind == 0:    # flip bytes anywhere
            b = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            yield bytes(b)
        elif kind == 1:  # truncate
            yield data[:rng.randrange(len(data))]
        elif kind == 2:  # random bytes, sometimes behind a valid header
            junk = rng.randbytes(rng.randrange(200))
            yield data[:HEADER_BYTES] + junk if rng.random() < 0.5 else junk
        elif kind == 3:  # forged declared size (zip bomb / huge allocation)
            b = bytearray(data)
            b[8:16] = rng.choice([2**62, 2**40, 2**33, len(data) * 1000]).to_bytes(8, "little")
            yield bytes(b)
        else:            # structural mutation, framed again so it reaches the codec and the optimizer
            yield frame(KIND_UPDATE, mutate_structure(rng, decode_body(data)))


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """`data` with bits flipped, truncated, its declared size forged, or junk behind its header."""
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


# --- the targets: what takes each kind of input (the worker's side) ---------------------------------------------

class Updates:
    """Mutated update messages through decode + apply on a version-0 replica."""

    def __init__(self, rng: random.Random, n: int, work: pathlib.Path):
        m = manifest()
        messages = valid_messages(m, GradientStream(m, seed=1))
        self.valid = {msg.digest for msg in messages.values()}
        self.checkpoint = genesis(m).checkpoint()
        self.replica = PolicyReplica.from_checkpoint(self.checkpoint)
        self.before = self.replica.digest
        self.inputs = update_mutations(rng, messages, n)

    def attempt(self, what: str) -> str | None:
        """Apply the next input; raises on a refusal; returns what is wrong with an acceptance, if anything."""
        data = next(self.inputs)
        self.replica.apply_bytes(data, what)
        # the mutation kept the message valid (e.g. it hit `meta`): it must have applied as one of the real versions
        got, self.replica = self.replica, PolicyReplica.from_checkpoint(self.checkpoint)
        if got.version != 1 or got.digest not in self.valid:
            return f"accepted as version {got.version}, digest {got.digest.hex()[:16]}: not a valid next version"
        return None

    def names(self, what: str) -> str:
        return what

    def mutated(self) -> str | None:
        """After a refusal: how the replica changed (the digest it keeps or the one of its state), or None."""
        kept, state = self.replica.digest, self.replica.state.digest()
        if kept == self.before and state == self.before:
            return None
        self.replica = PolicyReplica.from_checkpoint(self.checkpoint)  # go on from a clean replica
        return f"digest {kept.hex()[:16]}, state digest {state.hex()[:16]}, was {self.before.hex()[:16]}"


def _trained():
    """(a version-1 replica, its checkpoint record's bytes): what the checkpoints, snapshots and chunk-headers kinds
    mutate."""
    m = manifest()
    replica = genesis(m)
    UpdateBuilder(replica, make_encoder("dense", m, Budget())).step(GradientStream(m, 1).next(), {"lr": 1e-3})
    return replica, replica.checkpoint().to_bytes()


class Checkpoints:
    """A checkpoint record's bytes mutated, decoded and loaded as a replica."""

    def __init__(self, rng: random.Random, n: int, work: pathlib.Path):
        self.rng = rng
        self.replica, self.ckpt = _trained()

    def attempt(self, what: str) -> str | None:
        got = PolicyReplica.from_checkpoint(decode_record(mutate_bytes(self.rng, self.ckpt), what), what)
        return None if got.digest == self.replica.digest else "an accepted checkpoint is not the original state"

    def names(self, what: str) -> str:
        return what

    def mutated(self) -> str | None:
        return None  # nothing held between inputs


class Snapshots(Checkpoints):
    """A site's snapshot folder with one file mutated, loaded by SnapshotStore."""

    def __init__(self, rng: random.Random, n: int, work: pathlib.Path):
        super().__init__(rng, n, work)
        self.store = SnapshotStore(str(work / "snap"))
        self.store.save(self.replica, Position(1))
        self.good = {p.name: p.read_bytes() for p in self.store.path.iterdir()}

    def attempt(self, what: str) -> str | None:
        rng, path = self.rng, self.store.path
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        for name, data in self.good.items():
            (path / name).write_bytes(data)
        target = rng.choice(sorted(self.good))
        data = self.good[target]
        (path / target).write_bytes(mutate_bytes(rng, data) if target.endswith(".ckpt") else
                                    rng.choice([data[:rng.randrange(len(data))], b"{}", b"[1]",
                                                b'{"next_offset": "x"}',
                                                data.replace(b'"next_offset": 1', b'"next_offset": -1'),
                                                rng.randbytes(30)]))
        got, _ = self.store.load()
        return None if got.digest == self.replica.digest else "an accepted snapshot is not the original state"

    def names(self, what: str) -> str:
        return f"snapshot {self.store.path}"  # a snapshot is named by its folder (one folder, one input at a time)


class Chunks(Checkpoints):
    """A chunked checkpoint's records with one header replaced, fed to a Reassembler."""

    def __init__(self, rng: random.Random, n: int, work: pathlib.Path):
        super().__init__(rng, n, work)
        self.records = [Record(i, k, v, h) for i, (k, v, h) in
                        enumerate(split(self.ckpt, RUN, "checkpoint", 1, len(self.ckpt) // 5 + 1))]

    def attempt(self, what: str) -> str | None:
        rng, recs = self.rng, list(self.records)
        j = rng.randrange(len(recs))
        h = dict(recs[j].headers)
        h[rng.choice(sorted(h) + ["hilo-extra"])] = rng.choice(WEIRD_HEADERS + [str(rng.randrange(2**63))])
        recs[j] = Record(recs[j].offset, recs[j].key, recs[j].value, h)
        r = Reassembler(RUN, f"{RUN}.checkpoints")
        out = [m for m in (r.feed(x) for x in recs) if m is not None]
        return None if all(m.data == self.ckpt for m in out) else "a reassembled message is not the original bytes"

    def names(self, what: str) -> str:
        return f"{RUN}.checkpoints offset "  # a record is named by its topic and offset


TARGETS = {"updates": Updates, "checkpoints": Checkpoints, "snapshots": Snapshots, "chunk-headers": Chunks}


def peak_rss_mib() -> float:
    """This process's peak resident set so far (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fuzz(kind: str, n: int, seed: int, work: pathlib.Path) -> dict:
    """n inputs of `kind` in this process, counted; the peak RSS growth is measured from after the setup."""
    rng = random.Random(f"{kind}:{seed}")  # a generator per kind: a kind's inputs do not depend on the others' counts
    target = TARGETS[kind](rng, n, work)
    res = {"tried": n, "rejected": 0, "accepted": 0, "unnamed": 0, "accepted_wrong": 0}
    if kind == "updates":
        res["mutated"] = 0
    res["examples"] = []

    def finding(key: str, text: str):
        res[key] += 1
        if len(res["examples"]) < EXAMPLES:  # the first few only: a list of every one would grow the RSS measured
            res["examples"].append(text)
    base, t0 = peak_rss_mib(), time.perf_counter()
    for i in range(n):
        what = f"fuzz#{i}"
        try:
            wrong = target.attempt(what)
        except Exception as e:  # noqa: BLE001  (every refusal is counted: one that is not a named HiloError is a finding)
            res["rejected"] += 1
            if not isinstance(e, HiloError) or target.names(what) not in str(e):
                finding("unnamed", f"{what}: unnamed refusal {type(e).__name__}: {str(e)[:300]}")
            if (changed := target.mutated()) is not None:
                finding("mutated", f"{what}: refused but the replica changed: {changed}")
        else:
            res["accepted"] += 1
            if wrong is not None:
                finding("accepted_wrong", f"{what}: {wrong}")
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["rss_growth_mib"] = round(peak_rss_mib() - base, 1)
    return res


def worker_main(argv=None) -> int:
    """`python -m hilo.ops.bench.fuzz --worker KIND N SEED DIR`: one kind fuzzed here, its counts as a JSON line."""
    ap = argparse.ArgumentParser(prog="python -m hilo.ops.bench.fuzz",
                                 description="The worker of `hilo bench fuzz` (run that instead): one kind of input "
                                 "fuzzed in this process, its counts printed as one JSON line.")
    ap.add_argument("--worker", nargs=4, required=True, metavar=("KIND", "N", "SEED", "DIR"),
                    help=f"KIND: {', '.join(KINDS)}; N inputs; SEED; DIR: a scratch folder (the snapshots kind's)")
    kind, n, seed, work = ap.parse_args(argv).worker
    if kind not in KINDS:
        ap.error(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    print(json.dumps(fuzz(kind, int(n), int(seed), pathlib.Path(work))), flush=True)
    return 0


# --- the benchmark: each kind in a fresh process, then the verdict ----------------------------------------------

def _say(*a):
    print(*a, file=sys.stderr, flush=True)


def run_kind(kind: str, n: int, seed: int) -> dict:
    """Fuzz n inputs of `kind` in a fresh process (its peak RSS growth its own); its counts, or {"error": ...}."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"hilo-fuzz-{kind}-") as work:
        try:
            # generous: the inputs take about 1-3 ms each on a 2-core machine
            p = subprocess.run([sys.executable, "-m", "hilo.ops.bench.fuzz", "--worker", kind, str(n), str(seed), work],
                               capture_output=True, text=True, timeout=600 + 0.02 * n)
        except subprocess.TimeoutExpired as e:
            return {"error": f"timed out after {e.timeout:.0f} s"}
    if p.returncode != 0:
        return {"error": f"worker exited {p.returncode}: {p.stderr[-3000:]}"}
    return json.loads(p.stdout.splitlines()[-1]) | {"process_s": round(time.monotonic() - t0, 1)}


def problems(kind: str, n: int, r: dict) -> list:
    """What keeps one kind's results from passing (empty when they do)."""
    if "error" in r:
        return [f"{kind}: {r['error']}"]
    out = [f"{kind}: {r[k]} {what}" for k, what in (("unnamed", "refusals not a HiloError naming the input"),
                                                    ("mutated", "refusals that changed the replica"),
                                                    ("accepted_wrong", "accepted inputs that were not the original"))
           if r.get(k)]
    if r["tried"] != n:
        out.append(f"{kind}: tried {r['tried']}, asked {n}")
    if not r["rejected"] > MIN_REJECTED[kind] * n:
        out.append(f"{kind}: {r['rejected']} of {n} rejected, not above {MIN_REJECTED[kind]:.0%}")
    if not r["rss_growth_mib"] < MAX_GROWTH_MIB[kind]:
        out.append(f"{kind}: peak RSS grew {r['rss_growth_mib']:.0f} MiB, not under {MAX_GROWTH_MIB[kind]}")
    return out


def table(res: dict) -> str:
    """The results as a markdown table, a row per kind."""
    rows = ["| input | tried | rejected | accepted | unnamed refusals | state changed on a refusal | seconds | "
            "peak RSS growth MiB |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, r in res["kinds"].items():
        if "error" in r:
            rows.append(f"| {kind} | {r['error'][:60]} | | | | | | |")
            continue
        rows.append(f"| {kind} | {r['tried']:,} | {r['rejected']:,} | {r['accepted']:,} | {r['unnamed']} | "
                    f"{r.get('mutated', '-')} | {r['seconds']:.1f} | {r['rss_growth_mib']:.1f} |")
    return "\n".join(rows)


def main(cfg: FuzzConfig, as_json: bool, out: str | None) -> int:
    """Run the benchmark; exit 0 only when every kind passes."""
    folder, found, kinds = results_dir("fuzz", out), [], {}
    t0 = time.monotonic()
    for kind, n in cfg.counts().items():
        _say(f"fuzz {kind}: {n:,} inputs in a fresh process")
        kinds[kind] = r = run_kind(kind, n, cfg.seed)
        found += (p := problems(kind, n, r))
        if "error" not in r:
            _say(f"fuzz {kind}: {r['rejected']:,} rejected, {r['accepted']:,} accepted in {r['seconds']:.1f} s, peak "
                 f"RSS +{r['rss_growth_mib']:.0f} MiB{'; ' + '; '.join(p) if p else ''}")
    res = {"scale": cfg.scale, "seed": cfg.seed, "counts": cfg.counts(),
           "limits": {"min_rejected": MIN_REJECTED, "max_rss_growth_mib": MAX_GROWTH_MIB},
           "kinds": kinds, "problems": found, "ok": not found, "seconds": round(time.monotonic() - t0, 1)}
    if not save(res, folder, "fuzz", as_json):
        print(table(res))
        print("\n".join(found) if found else "ok: every refusal named, nothing changed or wrongly accepted")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(worker_main())
