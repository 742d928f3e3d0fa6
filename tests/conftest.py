"""Shared fixtures: a small adapter manifest, seeded gradients, and a fresh genesis replica."""
import pytest

from hilo.ops.bench.synthetic import GradientStream, initial_params, qwen3_manifest
from hilo.replica.replica import PolicyReplica

CODECS = ("dense", "topk", "powersgd", "spar")
OPTIMIZERS = ("sgd", "adamw", "lion", "muon")
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
