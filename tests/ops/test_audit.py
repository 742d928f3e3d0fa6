"""The trainer's audit over real `hilo rl` runs with a real vLLM CPU server: honest sites pass every audit (the margin
to the tolerance is reported); a site that serves v-1 while claiming v, one that serves a perturbed adapter, and one
that makes up its log-probabilities are each quarantined while the honest site carries the run to the trainer's digest;
one that stamps its made-up rollouts as spanning two versions is too, and stays quarantined across a trainer restart.
The liars run as `python -m hilo.ops.faults.lying_site LIE ...` (ops/faults/lies.py) and, where their own self-check
would stop them, --no-self-check."""
import functools
import json
import os
import re

import pytest

from hilo.producer.audit_noise import honest_noise
from tests.conftest import new_run
from tests.helpers import hilo, lying_site, reaped, wait_until

# one worker runs every test of group vllm-b, on the second fp32 server (adapter names, its 2 LoRA slots, its CPU)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm-b")]


@pytest.fixture(scope="session")
def vllm(vllm_b):
    """This module's tests (group vllm-b) use the second fp32 server (tests/conftest.py)."""
    return vllm_b
# partial credit: the random tiny policy's samples differ, so every step moves it (with the 0/1 reward it stays put)
REWARD = "hilo.ops.digit_task:partial_reward"
TOLERANCE = honest_noise("vllm", "float32").tolerance  # the audit's default for these fp32 sites (audit_noise.py)
RL = ("--batch-prompts", "2", "--samples", "2", "--staleness", "1", "--reward", REWARD, "--json")


def _site(log, run, name, tmp_path, vllm_url, steps, *extra, lie=None, dtype="float32"):
    """A generating site of `run` that exits at v`steps`, exporting adapters in `dtype`; its stderr in
    tmp_path/NAME.log. `lie`: one of ops/faults/lies.py that the site tells (None: honest)."""
    start = functools.partial(lying_site, lie) if lie else functools.partial(hilo, "consume")
    with open(tmp_path / f"{name}.log", "w") as stderr:  # the child holds its own copy
        return start("--log", log, "--run", run, "--site", name, "--state-dir", str(tmp_path / name), "--vllm",
                     vllm_url, "--lora-name", f"{run}-{name}", "--export-dtype", dtype, "--generate", "--reward",
                     REWARD,
                     "--generate-batch", "2", "--until-version", str(steps), "--wait-checkpoint", "300",
                     "--no-progress", *extra,
                     stderr=stderr)


def _said(err: str, tmp_path) -> str:
    """A failed trainer's stderr tail and each site's (the sites' logs go with the test's tmp_path, which pytest
    keeps for the last three runs only)."""
    return err[-3000:] + "".join(f"\n--- {log.name} ---\n{log.read_text()[-2000:]}"
                                 for log in sorted(tmp_path.glob("*.log")))


def _liar_then_honest(log, run, tmp_path, url, steps, trainer_args, lie, *extra, until=None, honest_dtype="float32"):
    """(trainer, {"honest", "liar"}): the liar and the trainer first, the honest site once the liar serves v0, so the
    liar answers prompts however slowly the machine starts processes (the honest site alone once took every prompt).
    The trainer stops at v`steps`, the sites at v`until` (default: the same)."""
    until = steps if until is None else until
    sites = {"liar": _site(log, run, "liar", tmp_path, url, until, *extra, lie=lie)}
    trainer = hilo("rl", "--vllm", url, "--log", log, "--run", run, "--sites", "0", "--steps", str(steps),
                   *trainer_args)
    try:
        wait_until(lambda: "now serves v0" in (tmp_path / "liar.log").read_text() or sites["liar"].poll() is not None,
                   600,
                   "the liar serves v0")
        assert sites["liar"].poll() is None, (tmp_path / "liar.log").read_text()[-3000:]
    except BaseException:
        for q in (trainer, *sites.values()):
            q.kill()
            q.wait()
        raise
    sites["honest"] = _site(log, run, "honest", tmp_path, url, until, dtype=honest_dtype)
    return trainer, sites


def test_honest_sites_pass_every_audit_and_the_margin_is_reported(vllm):
    url, _ = vllm
    p = hilo("rl", "--vllm", url, "--steps", "3", "--sites", "2", "--audit-share", "1", *RL)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    res = json.loads(out)
    audit = res["audit"]
    # (on one machine the first site to start often answers every prompt of a short run)
    assert res["ok"] and audit["share"] == 1.0 and audit["sites"] and set(audit["sites"]) <= {"site-1", "site-2"}
    for v in audit["sites"].values():
        assert v["audited"] > 0 and v["failed"] == 0 and not v["quarantined"] and v["worst"] < TOLERANCE, v
    worst = max(v["worst"] for v in audit["sites"].values())
    assert re.search(r"audit site-\d: \d+ audited, \d+ passed, 0 failed, worst difference", err), err[-2000:]
    assert all(r["audit_s"] >= 0 for r in res["steps"]) and audit["seconds"] > 0
    print(f"honest worst per-token difference {worst:.3g}, tolerance {TOLERANCE:g}: margin "
          f"{TOLERANCE / max(worst, 1e-12):.0f}x")


@pytest.mark.parametrize("lie, extra, lr", [
    ("previous", ("--no-self-check",), "3e-3"),  # serves v-1 while claiming v (a stale adapter under the same name)
    # one block scaled by 1 + 1e-3: it moves log-probabilities in proportion to the adapter's own effect, which on the
    # random tiny model at lr 3e-3 stays about 3e-6 (below the honest noise); at 3e-2 it is 4e-5 to 4e-4
    ("perturb", ("--no-self-check",), "3e-2"),  # at the tiny base's own tolerance (below)
    ("logprobs", (), "3e-3"),                    # well-signed rollouts, made-up log-probabilities
])
def test_a_lying_site_is_quarantined_and_the_honest_site_carries_the_run(vllm, tmp_path, lie, extra, lr):
    url, _ = vllm
    log, run, steps = f"file://{tmp_path}/log", new_run(f"audit{lie}"), 6
    # the tiny random base's tolerance, 1e-5 (honest differences stay under 1.3e-6 on it; the default, 1e-4, fits the
    # pretrained student base too): a perturbed block moves log-probabilities by 3e-5 to 9e-5 at lr 3e-2
    trainer, sites = _liar_then_honest(log, run, tmp_path, url, steps,
                                       ("--audit-share", "1", "--audit-tolerance", "1e-5", "--lr", lr, *RL), lie,
                                       *extra)
    with reaped(trainer, sites):
        out, err = trainer.communicate(timeout=900)
        assert trainer.returncode == 0, _said(err, tmp_path)
        digests = {n: re.search(r"digest ([0-9a-f]{32})", s.communicate(timeout=300)[0] or "")
                   for n, s in sites.items()}
    res = json.loads(out)
    liar, honest = res["audit"]["sites"]["liar"], res["audit"]["sites"]["honest"]
    # at its 2nd failure (the probe, on by default, counts its failures after that too)
    assert liar["quarantined"] and liar["evidence"].startswith("2 of ") and liar["failed"] >= 2, liar
    assert honest["failed"] == 0 and not honest["quarantined"], honest
    assert res["dropped"].get("quarantined", 0) + res["dropped"].get("audit-failed", 0) > 0, res["dropped"]
    said = [line for line in err.splitlines() if "QUARANTINED site liar" in line]
    print(f"{lie}: liar audited {liar['audited']} (passed {liar['passed']}), quarantined at its failure "
          f"{liar['failed']}, worst {liar['worst']:.3g}; honest audited {honest['audited']}, worst "
          f"{honest['worst']:.3g}; dropped {res['dropped']}\n  {said[0] if said else None}")
    assert len(said) == 1 and "claims v" in said[0] and "tolerance" in said[0], said
    # the run went on: every version trained and published, and both sites (the liar's replica is exact) at its digest
    assert res["version"] == steps and all(m is not None and m.group(1) == res["trainer_digest"]
                                           for m in digests.values()), digests


def test_a_site_whose_self_check_fails_generates_nothing_and_says_so(vllm, tmp_path):
    """A site serving v-1 under v with its self-check on: it stops itself before the trainer has to."""
    url, _ = vllm
    log, run, steps = f"file://{tmp_path}/log", new_run("selfcheck"), 2
    site = _site(log, run, "s", tmp_path, url, steps, lie="previous")
    honest = _site(log, run, "h", tmp_path, url, steps)
    trainer = hilo("rl", "--vllm", url, "--log", log, "--run", run, "--sites", "0", "--steps", str(steps),
                   "--audit-share", "1",
                   *RL)
    with reaped(trainer, site, honest):
        out, err = trainer.communicate(timeout=900)
        assert trainer.returncode == 0, _said(err, tmp_path)
        for p in (site, honest):
            p.communicate(timeout=300)
    res = json.loads(out)
    lines = (tmp_path / "s.log").read_text().splitlines()
    failed = [x for x in lines if "self-check failed: vLLM does not serve v" in x]
    assert failed and re.search(r"differ from the replica's by up to \S+ \(token \d+ after \d+ of the probe's 12 "
                                r"tokens; tolerance", failed[0]), failed
    # what it generated (with v0, before its first bad load) was right; after that it generated nothing
    assert res["ok"] and res["audit"]["sites"].get("s", {"failed": 0})["failed"] == 0, res["audit"]
    assert any("takes no prompts until its vLLM answers again" in x for x in lines), lines[-20:]


def test_a_site_sampling_from_a_sharper_policy_with_the_right_logprobs_is_caught_by_the_sampling_test(vllm, tmp_path):
    """The lie `sharpen`: the site asks vLLM for a quarter of the prompt's temperature and reports vLLM's
    log-probabilities of what it sampled, which are right: every per-token check passes. The standardized surprisal sum
    of its tokens drifts (an honest site's stays near 0) and quarantines it. The limits are lowered to fit a short
    run."""
    url, _ = vllm
    log, run, steps = f"file://{tmp_path}/log", new_run("auditsharp"), 8
    trainer, sites = _liar_then_honest(log, run, tmp_path, url, steps, (
        "--audit-share", "1", "--audit-sampling-z-limit", "4", "--audit-sampling-min-tokens", "20",
        "--audit-release-after", "0",
        *RL), "sharpen")
    with reaped(trainer, sites):
        out, err = trainer.communicate(timeout=900)
        assert trainer.returncode == 0, _said(err, tmp_path)
        for s in sites.values():
            s.communicate(timeout=300)
    res = json.loads(out)
    liar, honest = res["audit"]["sites"]["liar"], res["audit"]["sites"]["honest"]
    print(f"sharpen: liar z {liar['z']:+.2f} over {liar['tokens']} tokens (failed {liar['failed']}), honest z "
          f"{honest['z']:+.2f} over {honest['tokens']} tokens")
    assert liar["failed"] == 0 and liar["quarantined"] and "standardized surprisal" in liar["evidence"], liar
    assert not honest["quarantined"] and abs(honest["z"]) < 4, honest


def test_a_spanning_stamp_liar_is_quarantined_and_stays_so_after_a_restart_and_a_bf16_site_is_one_line(vllm, tmp_path):
    """The lie `span`: made-up log-probabilities on rollouts stamped version_end = version_start + 1 (all of them were
    accepted unaudited before). Such a stamp names a version the trainer has not published (refused, `bad-stamp`) or,
    from a site behind the head, is audited across the span: the liar is quarantined. Beside it an honest site
    exporting bf16 adapters (`hilo consume`'s default; the trainer assumes float32): one warning line, audited at bf16,
    never failed. The trainer, stopped at v3 and started again on its state dir, still refuses the liar."""
    url, _ = vllm
    log, run, steps = f"file://{tmp_path}/log", new_run("auditspan"), 5
    args = ("--log", log, "--run", run, "--sites", "0", "--state-dir", str(tmp_path / "trainer"), "--audit-share", "1",
            *RL)
    trainer, sites = _liar_then_honest(log, run, tmp_path, url, 3, args[6:], "span", until=steps,
                                       honest_dtype="bfloat16")
    with reaped(trainer, sites):
        out, err = trainer.communicate(timeout=900)
        assert trainer.returncode == 0, _said(err, tmp_path)
        again = hilo("rl", "--vllm", url, "--steps", str(steps), *args)
        with reaped(again):
            out2, err2 = again.communicate(timeout=900)
        assert again.returncode == 0, _said(err2, tmp_path)
        digests = {n: re.search(r"digest ([0-9a-f]{32})", s.communicate(timeout=300)[0] or "")
                   for n, s in sites.items()}
    first, second = json.loads(out), json.loads(out2)
    liar, honest = first["audit"]["sites"]["liar"], first["audit"]["sites"]["honest"]
    print(f"span: liar refused {liar['refused']}, audited {liar['audited']} ({liar['spanning']} spanning), failed "
          f"{liar['failed']}: {liar['evidence']}\n  honest: audited {honest['audited']}, worst {honest['worst']:.3g}, "
          f"served by {honest['served']}; dropped {first['dropped']}, after the restart {second['dropped']}")
    assert liar["quarantined"] and liar["failed"] >= 2 and liar["refused"] + liar["audited"] >= 2, liar
    assert ("is not published" in liar["evidence"]
            or "claims v" in liar["evidence"]) and liar["served"].startswith("vllm ")
    assert first["dropped"].get("bad-stamp", 0) + first["dropped"].get("audit-failed", 0) >= 2, first["dropped"]
    assert honest["audited"] > 0 and honest["failed"] == 0 and not honest["quarantined"], honest
    assert honest["served"].startswith("vllm ") and honest["served"].endswith(", bfloat16 adapters"), honest
    said = [line for line in err.splitlines() if "site honest serves vllm" in line]
    assert len(said) == 1 and "not the float32 adapters this trainer assumed" in said[0], said
    # restarted: the verdict came back from the state dir, and the liar's rollouts are dropped (the probe, on by
    # default, may audit or refuse a few more of them: each fails, none passes, and none releases it)
    kept = second["audit"]["sites"]["liar"]
    assert kept["quarantined"] and kept["evidence"] == liar["evidence"], kept
    assert kept["passed"] == liar["passed"] == 0 and kept["failed"] >= liar["failed"], (kept, liar)
    assert kept["failed"] - liar["failed"] <= (kept["audited"] - liar["audited"]) + (kept["refused"] - liar["refused"])
    assert any("site liar stays quarantined" in line for line in err2.splitlines()), err2[-3000:]
    # whatever the liar sends the restarted trainer is dropped (it may send nothing: the honest site can take every
    # prompt of two versions), and nothing it sent passed (kept["passed"] == 0 above)
    assert set(second["dropped"]) <= {"quarantined", "bad-stamp", "audit-failed"} and second["version"] == steps, second

    assert all(m is not None and m.group(1) == second["trainer_digest"] for m in digests.values()), digests


def test_a_site_that_stops_lying_is_released_by_the_default_probe_within_its_time_bound(vllm, tmp_path):
    """The probe is on by default: a site quarantined for made-up log-probabilities, restarted honest by its operator
    (same name, same state dir), passes release_after audited rollouts in a row and is released by itself; the run then
    finishes on it. Probe audits took at most probe_share of the trainer's time (its own accounting, in the summary).
    The sampling test's minimum is lowered to fit a short run."""
    url, _ = vllm
    log, run, steps = f"file://{tmp_path}/log", new_run("auditprobe"), 2
    with open(tmp_path / "trainer.log", "w") as stderr:
        trainer = hilo("rl", "--vllm", url, "--log", log, "--run", run, "--sites", "0", "--steps", str(steps),
                       "--audit-share",
                       "1", "--audit-sampling-min-tokens", "32", *RL, stderr=stderr)
    liar = _site(log, run, "s", tmp_path, url, steps, lie="logprobs")
    sites = {"liar": liar}
    with reaped(trainer, sites):
        wait_until(lambda: "QUARANTINED site s" in (tmp_path / "trainer.log").read_text() or trainer.poll() is not None,
                   600,
                   "the liar is quarantined")
        liar.terminate()
        liar.wait(timeout=120)
        sites["honest"] = _site(log, run, "s", tmp_path, url, steps)  # the operator fixed it: same site, same state dir
        out, _ = trainer.communicate(timeout=900)
        err = (tmp_path / "trainer.log").read_text()
        assert trainer.returncode == 0, _said(err, tmp_path)
        sites["honest"].communicate(timeout=300)
    res = json.loads(out)
    audit, v = res["audit"], res["audit"]["sites"]["s"]
    released = [line for line in err.splitlines() if "site s released from quarantine (it passed its probe" in line]
    print(f"probe: {audit['probe_seconds']:.3f} s of probes, budget {audit['probe_budget_s']:.3f} s, longest "
          f"{audit['probe_longest_s']:.3f} s, {audit['probes_skipped']} skipped\n  {released}")
    assert len(released) == 1 and not v["quarantined"] and res["version"] == steps, (released, v)
    assert 0 < audit["probe_seconds"] <= audit["probe_budget_s"] + audit["probe_longest_s"], audit


def _served(dtype):
    """(URL, base) of a vLLM server of the tiny base serving `dtype`: this group's own for float32 (HILO_VLLM_B),
    HILO_VLLM_BF16 for bfloat16 (ops/test.sh starts it: ops/vllm/start.sh BASE --max-lora-rank 16 --dtype bfloat16 on
    port 8015)."""
    if dtype == "float32":
        return os.environ.get("HILO_VLLM_B")
    url = os.environ.get("HILO_VLLM_BF16")
    if not url:
        pytest.fail("no bf16 vLLM server: HILO_VLLM_BF16 is unset (ops/test.sh starts one on port 8015)")
    return url


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bench_audit_served_quick_the_statistical_verdict_keeps_honest_sites_and_catches_liars(vllm, tmp_path, dtype):
    """`hilo bench audit --served` at a small N: an honest site at the served dtype is never quarantined; one serving
    v-1 is caught. At fp32 a perturbed block (x 1 + 1e-3) moves each token by ~6e-6, under the per-token tolerance
    (1e-4): only the statistical verdict catches it. At bf16 made-up log-probabilities pass the per-token tolerance; the
    statistical verdict catches them."""
    url = _served(dtype)
    p = hilo("bench", "audit", "--served", f"{url}={dtype}", "--shares", "", "--honest", "48", "--liar", "16", "--json",
             "--out", str(tmp_path))
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    row = json.loads(out)["served"][0]
    stat, per_token = row["liars"]["statistical"], row["liars"]["per-token"]
    print(f"{dtype}: honest |d| mean {row['differences']['abs_mean']:.2e} worst {row['differences']['worst']:.2e}; "
          f"statistical: {({k: v['first_quarantine'] for k, v in stat.items()})}; per-token: "
          f"{({k: v['first_quarantine'] for k, v in per_token.items()})}")
    assert all(h["quarantines"] == 0 for h in row["honest"].values()), row["honest"]
    assert stat["previous"]["first_quarantine"] is not None, stat
    if dtype == "float32":
        assert stat["logprobs"]["first_quarantine"] is not None, stat
        assert stat["perturb"]["first_quarantine"] is not None and per_token["perturb"][
            "first_quarantine"] is None, stat
    # x 0.99 is ~2e-2 a token, under bf16's tolerance: caught by the statistics (within 16 rollouts at headroom 1;
    else:
        # at the default 10, by the 80th: docs/benchmarks.md); a perturbed block is below bf16's noise, caught by
        # nothing
        assert per_token["logprobs"]["first_quarantine"] is None, per_token
        assert row["liars"]["statistical, headroom 1"]["logprobs"]["first_quarantine"] is not None, row["liars"]
