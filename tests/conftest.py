"""Shared fixtures: a small adapter manifest, seeded gradients, and a fresh genesis replica."""
import os
import uuid

import pytest

# No telemetry from the Hugging Face libraries (TRL's trainer asks for it): its sender is a thread that outlives the
# test that started it, and it would dial huggingface.co from a test run. Set before anything imports huggingface_hub.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# One OpenMP thread in every test process and every process a test starts (they inherit it; set before torch loads):
# the suite runs its workers, their subprocesses, the brokers and vLLM on a few cores, where torch's second thread
# spins or waits at a barrier for a peer that is descheduled. 150 training steps of the tiny model took 1.4 s alone
# either way, but 19.5 s with 2 threads beside one other busy process (1.4 s with 1). A test that needs a thread
# count sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from hilo.replica.synthetic import GradientStream, initial_params, qwen3_manifest
from hilo.replica.codecs import CODECS as CODEC_REGISTRY
from hilo.replica.optimizers import OPTIMIZERS as OPTIMIZER_REGISTRY
from hilo.replica.replica import PolicyReplica

# Every test (and module) must stop what it starts: threads, child processes, Kafka clients (tests/leakcheck.py).
# xdist groups that group; heavy tests one at a time
pytest_plugins = ["tests.leakcheck", "tests.xdist_groups", "tests.heavy", "tests.cpu_account"]

CODECS = tuple(CODEC_REGISTRY)
LOSSY = tuple(name for name, c in CODEC_REGISTRY.items() if c.lossy)
OPTIMIZERS = tuple(OPTIMIZER_REGISTRY)
LR = {"sgd": 0.05, "adamw": 1e-3, "lion": 1e-4, "muon": 0.02}


@pytest.fixture
def manifest():
    """Two layers of a tiny Qwen3 shape, rank 8: 28 blocks, 57,344 parameters."""
    return qwen3_manifest("tiny", rank=8)


@pytest.fixture
def grads(manifest):
    """A seeded synthetic gradient stream for `manifest`."""
    return GradientStream(manifest, seed=1)


def genesis(manifest, optimizer="adamw", run="test-run"):
    """A version-0 replica with seeded initial params."""
    return PolicyReplica.genesis(run, manifest, initial_params(manifest, seed=0), optimizer)


KAFKA_URL = os.environ.get("HILO_KAFKA", "kafka://127.0.0.1:9092")


def new_run(prefix="t"):
    """A run id no other test (or earlier CI run on the same broker) has used."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["file", pytest.param("kafka", marks=pytest.mark.kafka)])
def log_url(request, tmp_path):
    """The same test on the embedded file log and on the real Kafka broker (ops/kafka/start.sh)."""
    return f"file://{tmp_path}/log" if request.param == "file" else KAFKA_URL


def small_model(seed=0, hidden=64, layers=2, rank=8):
    """The tiny trainer's model at test size."""
    from hilo.ops.tiny_trainer import build_model
    return build_model(seed=seed, rank=rank, hidden=hidden, layers=layers)


def producer_config(**kw):
    """ProducerConfig for the test-size model: a budget that leaves payload room (1.6% of it would not)."""
    from hilo.producer.config import ProducerConfig
    from hilo.replica.codecs import Budget
    return ProducerConfig(**({"budget": Budget(0.25)} | kw))


def publish_random(producer, n, seed=0, scale=0.01):
    """n versions from seeded random LoRA gradients (no forward pass); returns the messages' sizes."""
    import torch
    gen = torch.Generator().manual_seed(seed * 7919 + producer.version)
    sizes = []
    for _ in range(n):
        for p in producer.params:
            p.grad = torch.randn(p.shape, generator=gen) * scale
        producer.step(lr=1e-3)
        sizes.append(producer.last_step["bytes"])
    return sizes


def _vllm_server(variable: str) -> tuple:
    """(base URL, base model dir) of the fp32 server whose URL is in `variable`; fails (not skips) when there is
    none."""
    url, base = os.environ.get(variable), os.environ.get("HILO_VLLM_BASE")
    assert url and base, (f"no vLLM server: ${variable} is unset; run through ops/test.sh (it starts the servers), or "
                          f"deselect with -m 'not vllm'")
    import requests
    requests.get(f"{url}/v1/models", timeout=10).raise_for_status()
    return url, base


@pytest.fixture(scope="session")
def vllm():
    """(base URL, base model dir) of the fp32 server of the "vllm" test group ($HILO_VLLM; ops/test.sh starts it)."""
    return _vllm_server("HILO_VLLM")


@pytest.fixture(scope="session")
def vllm_b():
    """The same for the "vllm-b" group ($HILO_VLLM_B, a second fp32 server of the same base): a module in that group
    overrides `vllm` with it, so its tests run beside the "vllm" group's instead of after them."""
    return _vllm_server("HILO_VLLM_B")


@pytest.fixture
def logs():
    """logs(url, **kw) -> open_log(url, **kw), closed when the test ends (the reads and appends a test makes by
    hand)."""
    from hilo.log import open_log
    opened = []

    def open_(url, **kw):
        opened.append(open_log(url, **kw))
        return opened[-1]
    yield open_
    for log in reversed(opened):
        log.close()

