"""Signed runs end to end on both backends: a site with --trust applies only the trainer's records."""
import json
import logging

import pytest

from hilo.log import checkpoints_topic, updates_topic
from hilo.producer.producer import HiLoProducer
from hilo.replica.state import ReplicaState
from hilo.schemas.chunks import split
from hilo.schemas.records import UpdateMessage
from hilo.schemas.signing import SignatureError, Signer, generate
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import open_site


def site(url, run, tmp_path, name="s", **kw):
    return open_site(url, run, tmp_path, name, export_adapters=False, **kw)


def _crafted_next(producer):
    """The attack the issue tried: a next update with a correct chain and a recomputed digest (a big step on block
    0)."""
    r = producer.replica
    hp = {"lr": 0.5, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    blocks = [{"i": i, "g": bytes(4 * b.numel) if i else b"\x00\x00\x80\x3f" * b.numel}
              for i, b in enumerate(r.manifest.blocks)]
    msg = UpdateMessage(r.run, r.version + 1, r.digest, bytes(16), r.manifest.manifest_id, "dense", {}, "adamw", hp,
                        blocks)
    state = r.compute(msg, "crafted")
    msg.digest = state.digest() if isinstance(state, ReplicaState) else None
    return msg


@pytest.mark.parametrize("forger", ["unsigned", "another key"])
def test_a_crafted_update_with_a_recomputed_chain_is_refused(log_url, tmp_path, forger, logs):
    """Was accepted: anyone who can write the topic and knows the algorithm moved every site."""
    keys, other = generate(tmp_path / "trainer-keys"), generate(tmp_path / "intruder-keys")
    run = new_run()
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url, signing_key=str(keys[0])))
    publish_random(producer, 3)
    crafted = _crafted_next(producer)
    data = crafted.to_bytes() if forger == "unsigned" else crafted.to_bytes(Signer.load(other[0]))
    at = logs(log_url).append(updates_topic(run), split(data, run, "update", 4))[0]
    # Without --trust the crafted update would be applied (its chain is right): that is what signatures close.
    # With it, the record is skipped (one warning, counted, in the history) and the site follows the trainer past it.
    hist = tmp_path / "s.jsonl"
    s = site(log_url, run, tmp_path, trust=str(keys[1]), until_version=5, history=str(hist))
    publish_random(producer, 2, seed=7)  # the trainer publishes v4 and v5 after the crafted record
    s.run(progress=False)
    reason = "unsigned" if forger == "unsigned" else "other-key"
    assert (s.follower.replica.version, s.follower.replica.digest) == (5, producer.replica.digest)
    assert dict(s.follower.skips) == {reason: 1}
    assert [(e["skip"], e["reason"]) for e in map(json.loads, hist.read_text().splitlines())
            if "skip" in e] == [(at, reason)]
    # A trainer restarted after the record resumes past it and publishes the next version.
    producer.close()
    restarted = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url, signing_key=str(keys[0])))
    assert restarted.replica.digest == s.follower.replica.digest
    publish_random(restarted, 1, seed=8)
    again = site(log_url, run, tmp_path, trust=str(keys[1]), until_version=6)  # restarted from its snapshot
    again.run(progress=False)
    assert again.follower.replica.digest == restarted.replica.digest
    # Fail-stop, for an operator who asks for it: the first bad record stops the site, the replica untouched.
    strict = site(log_url, run, tmp_path, name="strict", trust=str(keys[1]), on_bad_record="stop", idle_exit_s=30)
    with pytest.raises(SignatureError, match=rf"offset {at} \(v4\): (unsigned|signed by key)"):
        strict.run(progress=False)
    assert strict.follower.replica.version == 3
    pos = json.loads((tmp_path / "strict" / "snapshot" / "position.json").read_text())
    assert pos["version"] == 3
    unprotected = site(log_url, run, tmp_path, name="open", until_version=4)
    unprotected.run(progress=False)
    assert unprotected.follower.replica.digest == crafted.digest  # the old behaviour, for contrast
    restarted.close()


def test_a_trusting_site_follows_a_signed_run_and_skips_a_forged_checkpoint(log_url, tmp_path, caplog, logs):
    keys, other = generate(tmp_path / "trainer-keys"), generate(tmp_path / "intruder-keys")
    run = new_run()
    producer = HiLoProducer.open(small_model(),
                                 producer_config(run=run, log=log_url, signing_key=str(keys[0]), checkpoint_every=3))
    publish_random(producer, 4)
    forged = producer.replica.checkpoint().to_bytes(Signer.load(other[0]))  # newest, but not the trainer's
    logs(log_url).append(checkpoints_topic(run),
                         split(forged, run, "checkpoint", 4, extra={"hilo-updates-offset": "4"}))
    s = site(log_url, run, tmp_path, trust=str(keys[1]), until_version=4)
    assert s.follower.replica.version == 3  # fell back to the genuine v3
    s.run(progress=False)
    assert s.follower.replica.digest == producer.replica.digest
    plain = site(log_url, run, tmp_path, name="plain", until_version=4)
    assert plain.follower.replica.version == 4  # the forged checkpoint is sound but for its key: that is what s refused
    plain.run(progress=False)
    told = [r for r in caplog.records if r.name == "hilo.replay.checks" and r.levelno == logging.WARNING]
    assert len(told) == 1  # a site without --trust is told once that the run is signed
    producer.close()


def test_a_run_changes_keys_without_restarting_its_sites(log_url, tmp_path, caplog, logs):
    """A signed 'next key' record moves every trusting site to the new key; a forged one is refused."""
    old, new, intruder = (generate(tmp_path / n) for n in ("old", "new", "intruder"))
    run = new_run()
    producer = HiLoProducer.open(small_model(),
                                 producer_config(run=run, log=log_url, signing_key=str(old[0]), checkpoint_every=100))
    publish_random(producer, 3)
    follower = site(log_url, run, tmp_path, name="live", trust=str(old[1]), until_version=3)
    follower.run(progress=False)
    producer.rotate_key(str(new[0]))
    publish_random(producer, 3, seed=1)  # v4..v6 signed by the new key only
    # restarted from its snapshot
    follower = site(log_url, run, tmp_path, name="live", trust=str(old[1]), until_version=6)
    follower.run(progress=False)
    assert follower.follower.replica.digest == producer.replica.digest
    publish_random(producer, 1, seed=2)
    # its snapshot remembers the rotation
    again = site(log_url, run, tmp_path, name="live", trust=str(old[1]), until_version=7)
    again.run(progress=False)
    assert again.follower.replica.digest == producer.replica.digest
    # new-key checkpoint refused: replays
    fresh = site(log_url, run, tmp_path, name="fresh", trust=str(old[1]), until_version=7)
    fresh.run(progress=False)
    assert fresh.follower.replica.digest == producer.replica.digest
    # A rotation record the intruder signed: refused, nothing moves.
    from hilo.schemas.records import KeyRotation
    forged = KeyRotation(run, 8, Signer.load(intruder[0]).public_bytes()).to_bytes(Signer.load(intruder[0]))
    logs(log_url).append(updates_topic(run), split(forged, run, "key", 7))
    strict = site(log_url, run, tmp_path, name="fresh", trust=str(old[1]), idle_exit_s=30, on_bad_record="stop")
    with pytest.raises(SignatureError, match=r"\(key record\): signed by key [0-9a-f]{16}, this site trusts key"):
        strict.run(progress=False)
    assert strict.follower.replica.version == 7
    publish_random(producer, 1, seed=3)  # v8, signed by the new key: trust did not move to the intruder's
    victim = site(log_url, run, tmp_path, name="fresh", trust=str(old[1]), until_version=8)
    victim.run(progress=False)
    assert victim.follower.replica.digest == producer.replica.digest and dict(victim.follower.skips) == {"other-key": 1}
    producer.close()
