"""A site's replica recycles the state each version replaces: the same bits as new buffers, no adapter-sized
allocation per version (the storage alternates between two sets), and a refused message still changes nothing."""
import dataclasses

import pytest

from hilo.producer.update_builder import UpdateBuilder
from hilo.replica.codecs import Budget, make_encoder
from hilo.schemas.errors import DivergenceError, NonFinite
from tests.conftest import genesis

# every step, with the options that take the optimizers' other paths (weight decay, Nesterov)
HPARAMS = {"adamw": {"lr": 1e-3, "weight_decay": 0.01}, "sgd": {"lr": 0.01, "weight_decay": 0.01, "nesterov": 1.0},
           "lion": {"lr": 1e-4, "weight_decay": 0.01}, "muon": {"lr": 0.02, "weight_decay": 0.01}, "add": {}}


def _messages(manifest, grads, optimizer, n):
    """n framed updates of a trainer replica (new buffers each version) and its digest after each."""
    trainer = genesis(manifest, optimizer)
    builder = UpdateBuilder(trainer, make_encoder("spar4", manifest, Budget(0.25)))
    out = []
    for _ in range(n):
        msg = builder.step(grads.next(), HPARAMS[optimizer])
        out.append((msg, trainer.digest))
    return out


def _storage(r) -> set:
    return {t.data_ptr() for t in r.state.params} | {t.data_ptr() for ts in r.state.slots.values() for t in ts}


@pytest.mark.parametrize("optimizer", list(HPARAMS))
def test_a_recycling_replica_matches_the_trainer_bit_for_bit_and_alternates_two_sets_of_buffers(manifest, grads,
                                                                                                optimizer):
    site = genesis(manifest, optimizer)
    site.recycle = True
    storage = []
    for msg, digest in _messages(manifest, grads, optimizer, 6):
        assert site.apply_bytes(msg.to_bytes(), f"v{msg.version}")
        assert site.digest == digest and site.state.digest() == digest
        storage.append(_storage(site))
    assert storage[0].isdisjoint(storage[1])
    # from v3 on every version writes into the buffers of the version two before: nothing adapter-sized is allocated
    assert storage[2] == storage[0] and storage[3] == storage[1] and storage[5] == storage[1]


def test_a_refused_message_leaves_a_recycling_replica_whole_and_the_next_good_one_applies(manifest, grads):
    site = genesis(manifest, "adamw")
    site.recycle = True
    msgs = _messages(manifest, grads, "adamw", 4)
    for msg, _ in msgs[:2]:
        site.apply_bytes(msg.to_bytes(), "good")
    before = site.digest
    # a digest the step does not produce: computed into the spare buffers, then refused
    wrong = dataclasses.replace(msgs[2][0], digest=bytes(16))
    with pytest.raises(DivergenceError):
        site.apply_bytes(wrong.to_bytes(), "wrong digest")
    assert site.version == 2 and site.digest == before and site.state.digest() == before
    # a learning rate that overflows the parameters: NaN/Inf found after the step wrote into the spare buffers
    huge = dataclasses.replace(msgs[2][0], hparams=msgs[2][0].hparams | {"lr": 3e38})
    with pytest.raises(NonFinite, match="would leave NaN/Inf in the params"):
        site.apply_bytes(huge.to_bytes(), "huge lr")
    assert site.version == 2 and site.digest == before and site.state.digest() == before
    for msg, digest in msgs[2:]:
        site.apply_bytes(msg.to_bytes(), "good")
        assert site.digest == digest


@pytest.mark.parametrize("size", [1, 7, 8, 64, 1000, 4099])
def test_the_finiteness_check_finds_one_nan_or_inf_anywhere(size):
    """finite.all_finite (min and max in one pass) against isfinite, at every position of vector-width edges."""
    import torch
    from hilo.replica.finite import all_finite as _all_finite
    base = torch.randn(size)
    assert _all_finite(base) and _all_finite(torch.empty(0))
    for bad in (float("nan"), float("inf"), -float("inf")):
        for i in sorted({0, size // 2, size - 1} | set(range(min(size, 17)))):
            t = base.clone()
            t[i] = bad
            assert not _all_finite(t), (bad, i)
            assert not _all_finite(t.view(1, -1))
