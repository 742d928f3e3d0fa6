"""`hilo inspect --offset` gives the follower's verdict: every kind of bad record the fuzz and bad-record tests use,
appended to a real log, gets from inspect the reason and the one-line error a site's follower skipped it with, and
inspect refuses an honestly declared 2 GiB zstd bomb within a site's memory bound."""
import io
import json
import os
import struct
import subprocess
import sys

import pytest
import torch
import zstandard

from hilo.log import checkpoints_topic, open_log, updates_topic
from hilo.log.tail import last_message, records
from hilo.ops.cli import main
from hilo.producer.producer import HiLoProducer
from hilo.replay.bad_records import Skipped
from hilo.replay.follower import Follower, bootstrap_from_log
from hilo.schemas.arrays import to_bytes
from hilo.schemas.chunks import split
from hilo.schemas.framing import _HEADER, KIND_UPDATE, MAGIC, SCHEMA_VERSION
from hilo.schemas.records import UpdateMessage
from hilo.schemas.signing import Signer, Verifier, generate
from tests.conftest import KAFKA_URL, new_run, producer_config, publish_random, small_model
from tests.log.test_memory_bounds import MiB, _refusal

ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
BOMB = 2 << 30   # the honestly declared zstd bomb: 2 GiB of zeros in ~64 KiB
BOUND_MIB = 48   # a site's bound on what refusing a forged size may cost (tests/log/test_memory_bounds.py)


def honest_bomb(size: int = BOMB) -> bytes:
    """An update frame that declares `size` decompressed bytes and really inflates to them."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=1).stream_writer(out, size=size, closefd=False) as w:
        block = bytes(16 * MiB)
        for _ in range(size // len(block)):
            w.write(block)
    return _HEADER.pack(MAGIC, SCHEMA_VERSION, KIND_UPDATE, 0, size) + out.getvalue()


class Ctx:
    """What a bad record is made from: the run, its head, the trainer's newest genuine message, signing keys."""

    def __init__(self, log, run, producer, signer=None, other_key=None):
        self.run, self.r, self.signer, self.other_key = run, producer.replica, signer, other_key
        self.v = producer.version + 1  # every bad record claims the next version, so the chain cannot explain a skip
        self.genuine = last_message(log, updates_topic(run), run)

    def update(self, *, codec="dense", optimizer="adamw", hparams=ADAMW, blocks=None, fill=b"\0\0\0\0", run=None,
               manifest_id=None, signer=None):
        """A framed next-version update (dense zeros unless told otherwise)."""
        r = self.r
        blocks = blocks if blocks is not None else [{"i": i, "g": fill * b.numel}
                                                    for i, b in enumerate(r.manifest.blocks)]
        return UpdateMessage(run or self.run, self.v, r.digest, b"\x07" * 16, manifest_id or r.manifest.manifest_id,
                             codec, {}, optimizer, hparams, blocks).to_bytes(signer)

    def records(self, data, kind="update"):
        """`data` as the chunk records of the next version."""
        return split(data, self.run, kind, self.v)


def _factors(ctx, u=65504.0, s=3e38):
    """A spar block 0 of rank 1: fp16 factors filled with `u`, fp32 scale `s` (the product may overflow)."""
    m, n = ctx.r.manifest.blocks[0].shape
    return [{"i": 0, "k": 1, "u": to_bytes(torch.full((1, m), u, dtype=torch.float16), "float16"),
             "v": to_bytes(torch.full((1, n), 65504.0, dtype=torch.float16), "float16"),
             "s": to_bytes(torch.tensor([s]), "float32")}]


def _nan_dense(ctx):
    """Dense zeros but one fp32 NaN in block 2."""
    blocks = [{"i": i, "g": bytes(4 * b.numel)} for i, b in enumerate(ctx.r.manifest.blocks)]
    blocks[2]["g"] = b"\x00\x00\xc0\x7f" + blocks[2]["g"][4:]
    return ctx.records(ctx.update(blocks=blocks))


def _forged_size(ctx):
    data = bytearray(ctx.update())
    data[8:16] = (1 << 40).to_bytes(8, "little")
    return ctx.records(bytes(data))


def _altered(ctx):
    data = bytearray(ctx.update(signer=ctx.signer))
    data[-100] ^= 1  # a body byte, after signing
    return ctx.records(bytes(data))


def _absurd_size(ctx):
    return [(k, v, h | {"hilo-size": str(1 << 61)}) for k, v, h in ctx.records(ctx.update())]


TOPK_N = {"i": 0, "n": 1 << 40, "idx": b"", "val": b"", "scale": 1.0}  # 2^40 entries declared, none sent
SPAR_K = {"i": 0, "k": 1 << 40, "u": b"", "v": b"", "s": b""}


def _schema_v1(ctx):
    data = bytearray(ctx.update())
    data[4:6] = (1).to_bytes(2, "little")
    return ctx.records(bytes(data))


# name -> (in a signed run, the reason a site skips it for, its records). Inspect is compared with what the site
# really did (its Skipped); the reason here pins that the site's verdict is the one intended.
BAD = {
    "noise": (False, "foreign", lambda c: [(None, os.urandom(300), {})]),
    "noise-with-headers": (False, "malformed", lambda c: c.records(os.urandom(300))),
    "another-run": (False, "other-run", lambda c: c.records(c.update(run="intruder"))),
    "forged-1tib-size": (False, "limit", _forged_size),
    "honest-2gib-zstd-bomb": (False, "limit", lambda c: c.records(honest_bomb())),
    "absurd-size-header": (False, "limit", _absurd_size),
    "schema-v1": (False, "unsupported", _schema_v1),
    "checkpoint-in-updates": (False, "malformed", lambda c: c.records(c.r.checkpoint().to_bytes(), kind="checkpoint")),
    "genuine-under-other-version": (False, "malformed", lambda c: c.records(c.genuine.data)),
    "adam-second-moment-overflow": (False, "non-finite", lambda c: c.records(c.update(fill=struct.pack("<f", 3e38)))),
    "nan-gradient": (False, "malformed", _nan_dense),
    "nan-factor": (False, "malformed",
                   lambda c: c.records(c.update(codec="spar", blocks=_factors(c, u=float("nan"), s=1.0)))),
    "overflowing-factors": (False, "non-finite", lambda c: c.records(c.update(codec="spar", blocks=_factors(c)))),
    "lr-1e300": (False, "malformed", lambda c: c.records(c.update(hparams=ADAMW | {"lr": 1e300}))),
    "lr-infinite-in-fp32": (False, "malformed", lambda c: c.records(c.update(hparams=ADAMW | {"lr": 1e39}))),
    "unknown-hparam": (False, "malformed", lambda c: c.records(c.update(hparams=ADAMW | {"bogus": 1.0}))),
    "absurd-topk-n": (False, "malformed", lambda c: c.records(c.update(codec="topk", blocks=[TOPK_N]))),
    "absurd-spar-k": (False, "malformed", lambda c: c.records(c.update(codec="spar", blocks=[SPAR_K]))),
    "unknown-codec": (False, "unsupported", lambda c: c.records(c.update(codec="zip"))),
    "other-optimizer": (False, "malformed", lambda c: c.records(c.update(optimizer="sgd", hparams={"lr": 1e-3}))),
    "other-manifest": (False, "malformed", lambda c: c.records(c.update(manifest_id=b"\x01" * 16))),
    "unsigned": (True, "unsigned", lambda c: c.records(c.update())),
    "other-key": (True, "other-key", lambda c: c.records(c.update(signer=Signer.load(c.other_key)))),
    "altered-after-signing": (True, "bad-signature", _altered),
    "signed-genuine-under-other-version": (True, "malformed", lambda c: c.records(c.genuine.data)),
    "signed-lr-1e300": (True, "malformed",
                        lambda c: c.records(c.update(hparams=ADAMW | {"lr": 1e300}, signer=c.signer))),
}


def _site_verdicts(url, run, trust, appended):
    """The follower's verdict on each appended record, as a site reaches it: {offset: Skipped}."""
    log = open_log(url)
    try:
        verifier = Verifier.load(trust) if trust else None
        replica, pos = bootstrap_from_log(log, run, verifier=verifier)
        follower = Follower(log, run, replica, pos, trust=verifier)
        seen = {e.offset: e for e in follower.catch_up() if isinstance(e, Skipped)}
    finally:
        log.close()
    assert set(seen) == set(appended.values()), f"the site skipped {sorted(seen)}, bad records are at {appended}"
    return seen


@pytest.fixture(scope="module", params=["file", pytest.param("kafka", marks=pytest.mark.kafka)])
def bad_log(request, tmp_path_factory):
    """Two runs (unsigned, signed) on one log, each: 2 genuine versions, then its bad records, then a site's
    verdicts."""
    tmp = tmp_path_factory.mktemp("inspect")
    url = f"file://{tmp}/log" if request.param == "file" else KAFKA_URL
    private, public = generate(tmp / "keys")
    other, _ = generate(tmp / "other")
    out = {}
    for signed in (False, True):
        run = new_run("insp")
        cfg = producer_config(run=run, log=url, codec="dense", **({"signing_key": str(private)} if signed else {}))
        producer = HiLoProducer.open(small_model(), cfg)
        publish_random(producer, 2)
        log = open_log(url)
        ctx = Ctx(log, run, producer, Signer.load(private) if signed else None, other)
        appended = {name: log.append(updates_topic(run), make(ctx))[0] for name, (s, _, make) in BAD.items()
                    if s == signed}
        producer.close()
        trust = str(public) if signed else None
        verdicts = _site_verdicts(url, run, trust, appended)
        out |= {name: (url, run, trust, at, verdicts[at]) for name, at in appended.items()}
    return out


@pytest.mark.parametrize("name", list(BAD))
def test_inspect_gives_the_sites_verdict(bad_log, name, capsys):
    url, run, trust, at, site = bad_log[name]
    assert site.reason == BAD[name][1], site.detail
    assert main(["inspect", "--log", url, "--run", run, "--offset", str(at), "--json",
                 *(["--trust", trust] if trust else [])]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["offset"], d["verdict"], d["reason"], d["detail"]) == (at, "skipped", site.reason, site.detail)


BURST = 600  # more junk records than one Kafka poll returns (500): the reader holds the rest, fetched ahead


@pytest.mark.kafka
def test_inspect_inside_a_burst_of_junk_gives_the_sites_verdict(logs, capsys):
    """Was: inside a burst of junk on Kafka, inspect said "every checkpoint ... has expired" (nothing had): the records
    fetched ahead of the offset it read filled the next poll, and the read of RUN.checkpoints came back empty."""
    run = new_run("burst")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=KAFKA_URL, codec="dense"))
    publish_random(producer, 2)
    log = logs(KAFKA_URL)
    ctx = Ctx(log, run, producer)
    # malformed, limit
    junk = [r for _ in range(BURST // 2) for r in (*ctx.records(os.urandom(300)), *_absurd_size(ctx))]
    first = log.append(updates_topic(run), junk)[0]
    producer.close()
    site = _site_verdicts(KAFKA_URL, run, None, {i: first + i for i in range(BURST)})
    for at in (first, first + 1, first + BURST - 1):
        assert main(["inspect", "--log", KAFKA_URL, "--run", run, "--offset", str(at),
                     "--json"]) == 0, capsys.readouterr().err
        d = json.loads(capsys.readouterr().out)
        assert (d["verdict"], d["reason"], d["detail"]) == ("skipped", site[at].reason, site[at].detail)
    assert [site[first].reason, site[first + 1].reason] == ["malformed", "limit"]


def test_without_a_usable_checkpoint_inspect_says_what_is_true(tmp_path, logs, capsys):
    """Was: "every checkpoint ... has expired" whenever none was found, although nothing had expired."""
    url, run = f"file://{tmp_path}/log", "r"
    log = logs(url)
    log.create_topics(run)
    log.append(checkpoints_topic(run), [(None, b"not a checkpoint", {})])
    log.append(updates_topic(run), split(os.urandom(300), run, "update", 1))
    assert main(["inspect", "--log", url, "--run", run, "--offset", "0"]) == 1
    err = capsys.readouterr().err
    assert "offset 0: no verdict" in err and "no checkpoint of run 'r' was read from r.checkpoints, which retains " \
        "every offset it has had (0..0)" in err and "expired" not in err, err


def test_the_table_covers_every_reason_a_site_skips_for():
    from hilo.replay.bad_records import SKIPPABLE
    assert {reason for _, reason, _ in BAD.values()} == {reason for _, reason in SKIPPABLE}


def test_a_genuine_version_and_a_key_rotation_are_valid(tmp_path, capsys):
    url, run = f"file://{tmp_path}/log", "r"
    private, public = generate(tmp_path / "keys")
    producer = HiLoProducer.open(small_model(),
                                 producer_config(run=run, log=url, codec="spar", signing_key=str(private)))
    publish_random(producer, 2)
    update = last_message(open_log(url), updates_topic(run), run).first_offset
    producer.rotate_key(str(generate(tmp_path / "next")[0]))
    producer.close()
    key = open_log(url).end_offset(updates_topic(run)) - 1
    assert main(["inspect", "--log", url, "--run", run, "--offset", str(update), "--trust", str(public)]) == 0
    out = capsys.readouterr().out
    assert "verdict: valid: passes every check a site runs" in out and "  codec: spar" in out, out
    assert main(["inspect", "--log", url, "--run", run, "--offset", str(key), "--trust", str(public), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["verdict"], d["message"]["kind"]) == ("valid", "key") and "signed by the trusted key" in d["detail"], d


def test_inspect_trusting_the_first_key_follows_a_verified_rotation(log_url, tmp_path, capsys, logs):
    """Was: every record after a rotation was `other-key` to `inspect --trust ORIGINAL`, though a site trusting the
    original key verifies the rotation and applies them. Now inspect follows it as a site does (replay/checks.py)."""
    old, new = (generate(tmp_path / n) for n in ("old", "new"))
    run = new_run("rotated")
    producer = HiLoProducer.open(small_model(),
                                 producer_config(run=run, log=log_url, codec="spar", signing_key=str(old[0]),
                                                                checkpoint_every=2, keep_checkpoints=10))
    publish_random(producer, 3)
    producer.rotate_key(str(new[0]))
    # v4..v6 signed by the new key, and the checkpoints of v3 (the rotation's), v4, v6
    publish_random(producer, 3, seed=1)
    producer.close()
    starts = [(r.offset, r.parsed.kind) for r in records(logs(log_url), updates_topic(run)) if r.parsed.first_chunk]
    key = next(i for i, (_, kind) in enumerate(starts) if kind == "key")
    after = starts[key + 1:]
    assert [kind for _, kind in after] == ["update"] * 3
    for offset, _ in starts[key:]:
        assert main(["inspect", "--log", log_url, "--run", run, "--offset", str(offset), "--trust", str(old[1]),
                     "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert (d["verdict"], d["reason"]) == ("valid", None), (offset, d)
    assert (f"signed by the trusted key {Verifier.load(new[1]).key_id.hex()}, trusted from v4 by a verified "
            f"rotation") in d["detail"]
    # trusting the new key, a site starts from its checkpoints: what it signed is valid
    assert main(["inspect", "--log", log_url, "--run", run, "--offset", str(after[0][0]), "--trust", str(new[1]),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "valid"


INSPECT = """import contextlib, io, json, resource, sys
import hilo.ops.cli, hilo.ops.commands.inspect, hilo.ops.inspect_record  # what inspect imports, before the baseline
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
base, out = rss(), io.StringIO()
with contextlib.redirect_stdout(out):
    rc = hilo.ops.cli.main(["inspect", "--log", sys.argv[1], "--run", "r", "--offset", sys.argv[2], "--json"])
print(json.dumps({"rc": rc, "inspect": json.loads(out.getvalue()), "grew_mib": rss() - base}))
"""


def test_inspect_refuses_an_honest_2_gib_zstd_bomb_within_a_sites_memory_bound(tmp_path):
    """Was: inspect decompressed it (4.8 GiB peak) and called it malformed; a site refuses it unread as over a limit."""
    bomb = split(honest_bomb(), "r", "update", 2)
    error, site_grew = _refusal(tmp_path, bomb)  # the site's verdict and what it cost, in a fresh process
    assert error and f"declared decompressed size {BOMB} > limit" in error and site_grew < BOUND_MIB
    at = open_log(f"file://{tmp_path}/log").end_offset(updates_topic("r")) - len(bomb)
    out = subprocess.run([sys.executable, "-c", INSPECT, f"file://{tmp_path}/log", str(at)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert (r["rc"], r["inspect"]["verdict"], r["inspect"]["reason"], r["inspect"]["detail"]) == (0, "skipped", "limit",
                                                                                                  error)
    assert r["grew_mib"] < BOUND_MIB, (f"inspect's peak RSS grew {r['grew_mib']:.0f} MiB (the site's: {site_grew:.0f} "
                                       f"MiB)")
