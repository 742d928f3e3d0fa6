"""Bad records appended while a real trainer and two real sites run (separate `hilo` processes), on both backends,
signed and unsigned: the sites skip each and end at the trainer's digest, a restarted trainer and a new site get past
them too, every site's history records the skip, and `hilo inspect --offset` says why."""
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
from tests.conftest import KAFKA_URL, new_run
from tests.helpers import hilo, wait_until

STEPS = 12  # bad records go in at v3 and v5; the trainer publishes past them
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


def _live_run(url, tmp_path, logs, kinds, signed):
    """A trainer and two sites on one run, each kind of bad record appended at a later version while the trainer
    publishes and the sites follow; then a restarted trainer, a new site and `hilo inspect` on each record."""
    run = new_run("live")
    sign, trust = [], []
    if signed:
        private, public = generate(str(tmp_path / "keys"))
        sign, trust = ["--signing-key", str(private)], ["--trust", str(public)]
    common = ["--log", url, "--run", run]
    trainer = hilo("produce", *common, "--steps", str(STEPS), *sign)
    sites = {name: hilo("consume", *common, "--site", name, "--state-dir", str(tmp_path / name), "--no-export",
                        "--until-version", str(STEPS), "--wait-checkpoint", "300", "--history",
                        str(tmp_path / f"{name}.jsonl"), *trust)
             for name in ("a", "b")}
    topic = updates_topic(run)
    log, bad = logs(url), []
    for i, kind in enumerate(kinds):
        wait_until(lambda i=i: _published(url, run) >= 3 + 2 * i, 300, f"the trainer publishes v{3 + 2 * i}")
        records, reason = _bad(kind, log, run)
        bad.append((log.append(topic, records)[0], reason))
    digest = _done(trainer, "trainer")
    for name, p in sites.items():
        assert _done(p, f"site {name}") == digest, f"site {name} ends at the trainer's digest"
        assert _skips(tmp_path / f"{name}.jsonl") == bad
    # a trainer restarted after the records resumes past them; a new site replays through them
    again = _done(hilo("produce", *common, "--steps", "2", *sign), "restarted trainer")
    fresh = hilo("consume", *common, "--site", "c", "--state-dir", str(tmp_path / "c"), "--no-export",
                 "--until-version",
                 str(STEPS + 2), "--history", str(tmp_path / "c.jsonl"), *trust)
    assert _done(fresh, "new site") == again
    assert _skips(tmp_path / "c.jsonl") == bad
    for at, reason in bad:
        shown = hilo("inspect", *common, "--offset", str(at), "--json", *trust)
        out, err = shown.communicate(timeout=120)
        assert shown.returncode == 0, err
        d = json.loads(out)
        assert (d["offset"], d["verdict"], d["reason"]) == (at, "skipped", reason)


def test_a_live_run_skips_garbled_and_oversized_records(log_url, tmp_path, logs):
    # both kinds in one run (a run is six processes); unsigned, so that noise is judged as noise, not as a bad signature
    _live_run(log_url, tmp_path, logs, ("noise-with-headers", "absurd-size"), signed=False)


@pytest.mark.kafka
def test_a_live_signed_run_skips_an_unsigned_record(tmp_path, logs):
    # on Kafka only: the signature check sits above the log, the same code on both backends
    _live_run(KAFKA_URL, tmp_path, logs, ("unsigned",), signed=True)
