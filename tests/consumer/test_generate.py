"""A generating site with a real vLLM server: prompts out, rollouts back, each stamped with the version that made it.

Version truth: the behaviour log-probabilities vLLM returns for a rollout stamped v equal the trainer's own
recomputation under v within test_vllm's tolerance (1e-4, fp32 adapters), and differ from the next version's.
"""
import itertools
import os
import signal
import subprocess

import pytest
import torch

from hilo.ops.digit_task import prompts, reward
from hilo.producer.producer import HiLoProducer
from hilo.producer.rollout_audit import AuditConfig, Auditor
from hilo.producer.rollout_book import RolloutPolicy
from hilo.producer.rollout_exchange import RolloutExchange
from hilo.schemas.rollouts import PromptRecord, Sampling
from tests.conftest import KAFKA_URL, new_run, producer_config
from tests.consumer.test_vllm import TOL, tiny_model
from tests.helpers import hilo, wait_until

# one worker runs every test of the shared vLLM server (adapter names, its 2 LoRA slots, its CPU)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]
LORA = "generate-test"   # its own adapter name on the shared server


def _train_step(producer, gen):
    for p in producer.params:
        p.grad = torch.randn(p.shape, generator=gen)
    producer.step(lr=3e-2)  # a large step: consecutive versions are far apart in log-probability


def _trainer_at_v1(tmp_path, prefix, seed):
    """(log URL, run, model, producer, generator) of a trainer on the embedded log that has published v1."""
    url, run = f"file://{tmp_path}/log", new_run(prefix)
    model = tiny_model()
    producer = HiLoProducer.open(model, producer_config(run=run, log=url, codec="dense"))
    gen = torch.Generator().manual_seed(seed)
    _train_step(producer, gen)
    return url, run, model, producer, gen


@torch.no_grad()
def _logprobs(model, prompt_ids, completion_ids):
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    lp = torch.log_softmax(model(ids).logits[0].double(), -1)
    n = len(prompt_ids)
    return torch.tensor([float(lp[n - 1 + i, t]) for i, t in enumerate(completion_ids)], dtype=torch.float64)


def _groups(exchange, producer, want, timeout_s=300):
    got = []

    def more():
        exchange.issue(source)
        got.extend(exchange.poll(producer.version, timeout_s=0.2))
        return len(got) >= want
    source = exchange.source
    wait_until(more, timeout_s, f"{want} complete groups", every_s=0)
    return got


def test_a_generating_site_answers_with_the_version_it_serves(vllm, tmp_path):
    vllm_url, _ = vllm
    url, run, model, producer, gen = _trainer_at_v1(tmp_path, "gen", seed=0)
    # README: rollouts
    exchange = RolloutExchange.open(producer.log, run, RolloutPolicy(batch_prompts=2, max_staleness=0))
    source = prompts(run, Sampling(n=3, temperature=1.0, top_p=1.0, max_tokens=4, seed=0),
                     min_version=lambda: producer.version)
    # README: end
    S = 0
    # README: audit
    auditor = Auditor(AuditConfig(share=1.0), model, producer.manifest, keep=S + 1, metrics=producer.metrics)
    auditor.remember(producer.version, producer.replica.state.params)   # at start, and after every producer.step()
    exchange.auditor = auditor
    # README: end
    exchange.source = source
    site = hilo("consume", "--log", url, "--run", run, "--site", "g", "--state-dir", str(tmp_path / "g"), "--vllm",
                vllm_url,
                "--lora-name", LORA, "--export-dtype", "float32", "--generate", "--reward",
                "hilo.ops.digit_task:reward",
                "--generate-batch", "2", "--until-version", "3", "--wait-checkpoint", "120")
    try:
        seen = {}
        for version in (1, 2):
            groups = _groups(exchange, producer, 2)
            for g in groups:
                assert len(g.rollouts) == 3 and [r.sample for r in g.rollouts] == [0, 1, 2]
                for r in g.rollouts:
                    assert (r.site, r.version_start, r.version_end, r.reward_fn) == ("g", version, version,
                                                                                     "hilo.ops.digit_task:reward")
                    assert r.reward == reward(g.prompt.token_ids, r.completion_ids)
                    assert 1 <= len(r.completion_ids) <= 4 and len(r.logprobs) == len(r.completion_ids)
                    mine = _logprobs(model, g.prompt.token_ids, r.completion_ids)
                    assert float((torch.tensor(r.logprobs, dtype=torch.float64) - mine).abs().max()) < TOL
                    seen[(version, g.prompt.prompt_id, r.sample)] = (g.prompt.token_ids, r)
                assert g.staleness == (0, 0, 0)
            _train_step(producer, gen)   # S = 0: every later prompt asks for the new version
            auditor.remember(producer.version, producer.replica.state.params)
        # the same samples scored under the next version differ by far more than the tolerance: the stamp is the truth
        for (version, _, _), (prompt_ids, r) in seen.items():
            if version == 1:
                theirs = torch.tensor(r.logprobs, dtype=torch.float64)
                assert float((theirs - _logprobs(model, prompt_ids, r.completion_ids)).abs().max()) > 10 * TOL
        out, err = site.communicate(timeout=300)
        assert site.returncode == 0, err[-3000:]
        assert exchange.book.dropped.total() == 0 and exchange.in_flight_peak <= 2
        v = auditor.verdicts["g"]  # every rollout recomputed under its version by the trainer: all passed
        assert (v.audited, v.passed, v.failed, v.quarantined) == (12, 12, 0, False) and v.worst < TOL
    finally:
        if site.poll() is None:
            site.kill()
        producer.close()


@pytest.mark.kafka
def test_a_prompt_for_a_newer_policy_does_not_hold_back_the_prompt_before_it(vllm, tmp_path):
    """One prompt partition on Kafka, a batch of 2 that mixes a prompt for the served v1 with one for v2: the site
    answers the first now and the second once it serves v2. It used to give both back and stop taking until v2, still
    holding the partition, so nobody answered the first and a trainer waiting for it never published v2 (the hang of
    the vLLM-gone RL test)."""
    vllm_url, _ = vllm
    run = new_run("defer")
    producer = HiLoProducer.open(tiny_model(), producer_config(run=run, log=KAFKA_URL, codec="dense"))
    gen = torch.Generator().manual_seed(2)
    _train_step(producer, gen)  # the site will serve v1
    asks = iter([1, 2])
    exchange = RolloutExchange.open(producer.log, run, RolloutPolicy(batch_prompts=1, max_staleness=1),
                                    prompt_partitions=1)
    sampling = Sampling(n=2, temperature=1.0, top_p=1.0, max_tokens=4, seed=0)
    assert exchange.issue(itertools.islice(prompts(run, sampling, min_version=lambda: next(asks)), 2)) == 2
    exchange.source = iter(())
    site = hilo("consume", "--log", KAFKA_URL, "--run", run, "--site", "d", "--state-dir", str(tmp_path / "d"),
                "--vllm", vllm_url,
                "--lora-name", "defer-d", "--generate", "--reward", "hilo.ops.digit_task:reward", "--generate-batch",
                "2", "--no-progress",
                "--wait-checkpoint", "120", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        first = _groups(exchange, producer, 1, timeout_s=120)  # the trainer is still at v1
        assert [g.prompt.prompt_id for g in first] == ["p-0"] and {r.version_start for r in first[0].rollouts} == {1}
        _train_step(producer, gen)
        second = _groups(exchange, producer, 1, timeout_s=120)
        assert [g.prompt.prompt_id for g in second] == ["p-1"] and {r.version_start for r in second[0].rollouts} == {2}
    finally:
        site.kill()
        site.wait()
        producer.close()


def _held_by(lease_table, site):
    """Lease ids the embedded log's lease table says `site` holds."""
    import json
    try:
        return {lid for lid, lease in json.loads(lease_table.read_text())["leases"].items() if lease["site"] == site}
    except (FileNotFoundError, ValueError):  # not written yet, or caught mid-replace
        return set()


def _lock_free(path) -> bool:
    """Whether no process holds the embedded log's lock on `path` (a site stopped inside it would stall the queue)."""
    import fcntl
    with open(path, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def test_a_site_stopped_past_the_staleness_bound_has_its_late_rollouts_dropped(vllm, tmp_path):
    """S = 1, B = 2: a site SIGSTOPped while it holds a prompt, for two trainer versions; its rollout arrives stale, is
    dropped with its group, never trained on; admission control keeps at most (S + 1) * B prompts in flight
    throughout."""
    vllm_url, _ = vllm
    url, run, model, producer, gen = _trainer_at_v1(tmp_path, "stale", seed=1)
    policy = RolloutPolicy(batch_prompts=2, max_staleness=1)
    exchange = RolloutExchange.open(producer.log, run, policy)
    source = prompts(run, Sampling(n=2, temperature=1.0, top_p=1.0, max_tokens=4, seed=0),
                     min_version=lambda: producer.version)
    sites = {name: hilo("consume", "--log", url, "--run", run, "--site", name, "--state-dir", str(tmp_path / name),
                        "--vllm",
                        vllm_url, "--lora-name", f"stale-{name}", "--export-dtype", "float32", "--generate", "--reward",
                        "hilo.ops.digit_task:reward", "--generate-batch", "1", "--lease-s", "600", "--no-progress",
                        stderr=None) for name in ("a", "b")}
    table = tmp_path / "log" / f"{run}.prompts" / "leases.json"
    trained, in_flight = [], []

    def pump():
        exchange.issue(source)
        in_flight.append(len(exchange.book.in_flight))
        for g in exchange.poll(producer.version, timeout_s=0.05):
            trained.append(g)
            if len(trained) % policy.batch_prompts == 0:
                _train_step(producer, gen)
    try:
        stopped_at = None

        def stop_a_holding_a_prompt():
            nonlocal stopped_at
            pump()
            if _held_by(table, "a"):
                os.kill(sites["a"].pid, signal.SIGSTOP)
                # holds a prompt, not the queue's lock
                if _held_by(table, "a") and _lock_free(table.with_name("records")):
                    stopped_at = producer.version
                    return True
                os.kill(sites["a"].pid, signal.SIGCONT)
            return False
        wait_until(stop_a_holding_a_prompt, 300, "site a stopped while it holds a prompt", every_s=0)
        wait_until(lambda: pump() or producer.version >= stopped_at + policy.max_staleness + 1, 300,
                   "two more versions trained from site b's rollouts", every_s=0)
        os.kill(sites["a"].pid, signal.SIGCONT)
        wait_until(lambda: pump() or exchange.book.dropped.get("stale", 0) >= 1, 300, "site a's late rollouts dropped",
                   every_s=0)
    finally:
        for p in sites.values():
            os.kill(p.pid, signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
        codes = {name: p.wait(timeout=120) for name, p in sites.items()}
        producer.close()
    assert codes == {"a": 0, "b": 0}
    assert max(in_flight) <= policy.max_in_flight and min(in_flight) >= 0
    assert all(max(g.staleness) <= policy.max_staleness for g in trained)
    assert dict(exchange.book.dropped).keys() == {"stale"}


def test_a_prompt_vllm_refuses_is_counted_and_the_site_keeps_answering(vllm, tmp_path):
    vllm_url, _ = vllm
    url, run, _, producer, _ = _trainer_at_v1(tmp_path, "refused", seed=2)
    exchange = RolloutExchange.open(producer.log, run, RolloutPolicy(batch_prompts=2, max_staleness=0))
    sampling = Sampling(n=2, temperature=1.0, top_p=1.0, max_tokens=4, seed=0)
    too_long = PromptRecord(run, "long", tuple([1] * 40), sampling, 1)  # the server's context is 32 tokens
    assert exchange.issue(iter([too_long])) == 1
    site = hilo("consume", "--log", url, "--run", run, "--site", "r", "--state-dir", str(tmp_path / "r"), "--vllm",
                vllm_url,
                "--lora-name", "refused-r", "--export-dtype", "float32", "--generate", "--reward",
                "hilo.ops.digit_task:reward",
                "--generate-batch", "1", "--no-progress")
    try:
        exchange.source = prompts(run, sampling, min_version=lambda: producer.version)
        [group] = _groups(exchange, producer, 1)   # the site answers the next prompt after refusing the long one
        assert group.prompt.prompt_id == "p-0" and site.poll() is None
    finally:
        site.send_signal(signal.SIGTERM)
        out, err = site.communicate(timeout=120)
        producer.close()
    assert site.returncode == 0
    refusals = [line for line in err.splitlines() if "refused a prompt (engine-refused)" in line]
    assert len(refusals) == 1 and "prompt long: vLLM at" in refusals[0], refusals
    assert "long" in exchange.book.in_flight  # never answered: the trainer still holds it (no rollout came back)


@pytest.mark.parametrize("args", [["--reward", "hilo.ops.digit_task:reward"], ["--vllm", "http://127.0.0.1:1"]])
def test_generate_without_a_server_or_a_reward_is_one_line_before_anything_is_written(tmp_path, args):
    p = hilo("consume", "--log", f"file://{tmp_path}/log", "--run", "r", "--site", "s", "--state-dir",
             str(tmp_path / "s"),
             "--generate", *args)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and err.strip().splitlines()[-1] == (
        "hilo consume: error: --generate needs --vllm URL (the server that answers) and --reward MODULE:FUNCTION (the "
        "digit task's: hilo.ops.digit_task:reward)")
    assert not (tmp_path / "s").exists() and not (tmp_path / "log").exists()
