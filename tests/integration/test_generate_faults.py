"""Exactly once on the return path, on the real broker with a real vLLM server: a generating site SIGKILLed at each
named crash point (after fetch, mid-generation, after produce before commit, after commit) and at a random
instant, restarted under the same name; a second site joins and then leaves. Every issued prompt ends with exactly
n accepted rollouts, and the rollouts topic (read_committed) holds each (prompt, sample) exactly once."""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from hilo.schemas.crash_points import GENERATE_POINTS
from hilo.ops.digit_task import prompts
from hilo.producer.producer import HiLoProducer
from hilo.producer.rollout_book import RolloutPolicy
from hilo.producer.rollout_exchange import RolloutExchange
from hilo.replay.history import check_return_path
from hilo.schemas.rollouts import Sampling
from tests.conftest import KAFKA_URL, new_run, producer_config, publish_random
from tests.consumer.test_vllm import tiny_model
from tests.helpers import reaped, wait_until

# one worker runs every test of group vllm-b, on the second fp32 server (adapter names, its 2 LoRA slots, its CPU)
pytestmark = [pytest.mark.kafka, pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm-b")]


@pytest.fixture(scope="session")
def vllm(vllm_b):
    """This module's tests (group vllm-b) use the second fp32 server (tests/conftest.py)."""
    return vllm_b
N = 2  # samples per prompt


def _site(run, name, tmp_path, vllm_url, crash=None):
    """A generating site process; its log goes to tmp_path/NAME.N.log (a pipe nobody reads could fill and stall it)."""
    env = {k: v for k, v in os.environ.items() if k != "HILO_CRASH_AT"} | ({"HILO_CRASH_AT": crash} if crash else {})
    log = tmp_path / f"{name}.{len(list(tmp_path.glob(f'{name}.*.log')))}.log"
    return subprocess.Popen([sys.executable, "-m", "hilo.ops.cli", "consume", "--log", KAFKA_URL, "--run", run,
                             "--site", name,
                             "--state-dir", str(tmp_path / name), "--vllm", vllm_url, "--lora-name", f"gen-{name}",
                             "--export-dtype", "float32", "--generate", "--reward", "hilo.ops.digit_task:reward",
                             "--generate-batch", "2", "--wait-checkpoint", "120", "--no-progress"],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w")), log


def test_a_generating_site_killed_anywhere_loses_no_prompt_and_duplicates_no_rollout(vllm, tmp_path):
    vllm_url, _ = vllm
    rng = random.Random(25)
    run = new_run("genkill")
    producer = HiLoProducer.open(tiny_model(), producer_config(run=run, log=KAFKA_URL, codec="dense"))
    publish_random(producer, 1)
    exchange = RolloutExchange.open(producer.log, run, RolloutPolicy(batch_prompts=8, max_staleness=4),
                                    prompt_partitions=2)
    # Prompts keep coming until every crash point has been reached: a fixed number could all be answered by the second
    # site before a victim takes one, and that victim would never reach its point (seen in a full run: 24 of 24
    # answered, the victim waiting). Then no more are issued, and every one issued must be answered exactly once.
    issued, issuing = [], [True]

    def stream():
        for prompt in prompts(run, Sampling(N, 1.0, 1.0, 3, 0)):
            if not issuing[0]:
                return
            issued.append(prompt.prompt_id)
            yield prompt
    source = stream()
    exchange.issue(source)
    groups, deadline = [], time.monotonic() + 600

    def pump():
        exchange.issue(source)
        groups.extend(exchange.poll(producer.version, timeout_s=0.2))
        assert time.monotonic() < deadline, f"{len(groups)} of {len(issued)} groups after 600 s"

    killed, running = {}, {}
    with reaped(running):
        for point in (*GENERATE_POINTS, "random"):
            victim = running["a"] = _site(run, "a", tmp_path, vllm_url,
                                          crash=None if point == "random" else f"{point}:1")[0]
            if point == "random":
                until = time.monotonic() + rng.uniform(8.0, 14.0)  # a random instant of its work (fault injection)
                while time.monotonic() < until and victim.poll() is None:
                    pump()
                victim.send_signal(signal.SIGKILL)
            while victim.poll() is None:
                pump()
            killed[point] = victim.wait()
            if point == GENERATE_POINTS[1]:
                running["b"], b_log = _site(run, "b", tmp_path, vllm_url)  # a second site joins mid-run ...
            if point == GENERATE_POINTS[3]:
                # ... and leaves once it takes part (a SIGTERM before its handler is installed would kill it mid-import)
                wait_until(lambda b_log=b_log: "generating for run" in b_log.read_text()
                           or running["b"].poll() is not None, 120,
                           "the second site starts generating")
                running["b"].send_signal(signal.SIGTERM)
                assert running["b"].wait(timeout=120) == 0
        assert all(code == -signal.SIGKILL for code in killed.values()), killed
        issuing[0] = False
        last, last_log = _site(run, "a", tmp_path, vllm_url)
        running["a"] = last
        wait_until(lambda: "generating for run" in last_log.read_text() or last.poll() is not None, 120,
                   "the last site starts")
        while len(groups) < len(issued):
            pump()
        last.send_signal(signal.SIGTERM)
        assert last.wait(timeout=120) == 0
    assert sorted(g.prompt.prompt_id for g in groups) == sorted(issued)
    assert all(len(g.rollouts) == N for g in groups)
    assert exchange.book.dropped.get("duplicate", 0) == 0, exchange.book.dropped
    report = check_return_path(producer.log, run)  # from the log alone: each prompt answered by exactly n rollouts
    assert report.ok and report.sites["rollouts"]["entries"] == len(issued) * N, report.anomalies
    producer.close()
