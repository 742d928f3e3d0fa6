"""A bad record appended while a real trainer and two real sites run (separate `hilo` processes), on both backends,
signed and unsigned: the sites skip it and end at the trainer's digest, a restarted trainer and a new site get past
it too, every site's history records the skip, and `hilo inspect --offset` says why."""
import json
import os
import re

import pytest

from hilo.log import open_log, updates_topic
from hilo.log.tail import head
from hilo.replay.follower import bootstrap_from_log
from hilo.schemas import headers as H
from hilo.schemas.chunks import split
from hilo.schemas.errors import HiloError
from hilo.schemas.records import UpdateMessage
from hilo.schemas.signing import generate
from tests.conftest import new_run
from tests.helpers import hilo, wait_until

STEPS = 30
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}


def _unsigned_update(log, run):
    """A well-formed update of the run, claiming a later version, with no signature."""
    r, _ = bootstrap_from_log(log, run)
    v = head(log, updates_topic(run), run).version + 1
    blocks = [{"i": i, "g": bytes(4 * b.numel)} for i, b in enumerate(r.manifest.blocks)]
    msg = UpdateMessage(run, v, r.digest, bytes(16), r.manifest.manifest_id, "dense", {}, "adamw", ADAMW, blocks)
    return split(msg.to_bytes(), run, "update", v)


def _published(url, run) -> int:
    """The newest version on the log (0 while the trainer has not made the run yet)."""
    try:
        return (head(open_log(url), updates_topic(run), run) or H.RecordHeaders()).version or 0
    except HiloError:  # the log or the run's topics do not exist yet
        return 0


def _bad(kind, log, run):
    """(records, the reason a site gives) for one kind of record."""
    if kind == "noise-with-headers":
        return split(os.urandom(300), run, "update", 7), "malformed"
    if kind == "absurd-size":
        return [(k, v, h | {H.SIZE: str(1 << 61)}) for k, v, h in split(os.urandom(300), run, "update", 7)], "limit"
    if kind == "unsigned":
        return _unsigned_update(log, run), "unsigned"
    raise AssertionError(kind)


def _done(proc, what) -> str:
    """The digest a finished `hilo produce` / `hilo consume` printed last (asserting exit 0)."""
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}: {err[-2000:]}"
    return re.search(r"digest ([0-9a-f]{32})", out.strip().splitlines()[-1]).group(1)


def _skips(path) -> list:
    return [(e["skip"], e["reason"]) for e in map(json.loads, open(path).read().splitlines()) if "skip" in e]


@pytest.mark.parametrize("kind,signed", [("noise-with-headers", False), ("absurd-size", False), ("unsigned", True)])
def test_a_live_run_skips_a_bad_record(log_url, tmp_path, kind, signed, logs):
    run = new_run("live")
    sign, trust = [], []
    if signed:
        private, public = generate(str(tmp_path / "keys"))
        sign, trust = ["--signing-key", str(private)], ["--trust", str(public)]
    common = ["--log", log_url, "--run", run]
    trainer = hilo("produce", *common, "--steps", str(STEPS), *sign)
    sites = {name: hilo("consume", *common, "--site", name, "--state-dir", str(tmp_path / name), "--no-export",
                        "--until-version", str(STEPS), "--wait-checkpoint", "300", "--history", str(tmp_path / f"{name}.jsonl"), *trust)
             for name in ("a", "b")}
    topic = updates_topic(run)
    wait_until(lambda: _published(log_url, run) >= 3, 300, "the trainer publishes v3")
    log = logs(log_url)
    records, reason = _bad(kind, log, run)
    at = log.append(topic, records)[0]  # while the trainer publishes and the sites follow
    digest = _done(trainer, "trainer")
    for name, p in sites.items():
        assert _done(p, f"site {name}") == digest, f"site {name} ends at the trainer's digest"
        assert _skips(tmp_path / f"{name}.jsonl") == [(at, reason)]
    # a trainer restarted after the record resumes past it; a new site replays through it
    again = _done(hilo("produce", *common, "--steps", "2", *sign), "restarted trainer")
    fresh = hilo("consume", *common, "--site", "c", "--state-dir", str(tmp_path / "c"), "--no-export", "--until-version",
                 str(STEPS + 2), "--history", str(tmp_path / "c.jsonl"), *trust)
    assert _done(fresh, "new site") == again
    assert _skips(tmp_path / "c.jsonl") == [(at, reason)]
    shown = hilo("inspect", *common, "--offset", str(at), "--json", *trust)
    out, err = shown.communicate(timeout=120)
    assert shown.returncode == 0, err
    d = json.loads(out)
    assert (d["offset"], d["verdict"], d["reason"]) == (at, "skipped", reason)
