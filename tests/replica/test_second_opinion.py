"""A step that misses the promised digest is looked at again before it stops a site: a one-off wrong result (a
memory or CPU fault, injected here into the first computation) is recomputed and the verified state kept; a held
state that changed in memory, and a step that is wrong twice, stop it with an error that says which."""
import dataclasses
import logging

import pytest
import torch

from hilo.producer.update_builder import UpdateBuilder
from hilo.replica.codecs import Budget, make_encoder
from hilo.schemas.errors import DivergenceError
from tests.conftest import genesis


def _messages(manifest, grads, n):
    """n updates of a trainer replica (dense: what it promises is exactly what a site computes) and its digest after
    each."""
    trainer = genesis(manifest, "adamw")
    builder = UpdateBuilder(trainer, make_encoder("dense", manifest, Budget(1.0)))
    out = []
    for _ in range(n):
        msg = builder.step(grads.next(), {"lr": 1e-3})
        out.append((msg, trainer.digest))
    return out


def _site(manifest):
    site = genesis(manifest, "adamw")
    site.recycle = True  # a site's replica: the second computation reuses the buffers the first one wrote
    return site


def test_a_one_off_wrong_step_is_recomputed_and_the_verified_state_kept(manifest, grads, caplog):
    msgs = _messages(manifest, grads, 3)
    site = _site(manifest)
    site.apply(msgs[0][0], "v1")
    compute, calls = site.compute, []

    def faulty_once(msg, what, decoded=None):
        state = compute(msg, what, decoded)
        calls.append(msg.version)
        if len(calls) == 1:  # one flipped bit in the first result, as a fault in the computation would leave it
            flat = state.params[3].view(-1)
            flat[7] = torch.nextafter(flat[7], torch.tensor(float("inf")))
            state.known = None  # the kernel hashes what it wrote: a wrong result's hashes are the wrong result's
        return state
    site.compute = faulty_once
    with caplog.at_level(logging.ERROR, logger="hilo.replica.replica"):
        assert site.apply(msgs[1][0], "v2")
    assert calls == [2, 2] and site.version == 2 and site.digest == msgs[1][1] == site.state.digest()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "computed one step two ways" in said[0] and msgs[1][1].hex() in said[0], said
    assert site.apply(msgs[2][0], "v3") and site.digest == msgs[2][1]  # and it goes on from the kept state


def test_a_held_state_changed_in_memory_is_named_and_nothing_is_adopted(manifest, grads):
    msgs = _messages(manifest, grads, 2)
    site = _site(manifest)
    site.apply(msgs[0][0], "v1")
    verified = site.digest
    site.state.params[0].view(-1)[0] += 1.0  # what a stray write into the live state would do
    with pytest.raises(DivergenceError,
                       match=r"v2: v1, the state version 2 starts from, changed in memory after it was verified"):
        site.apply(msgs[1][0], "v2")
    assert site.version == 1 and site.digest == verified


def test_a_step_wrong_twice_stops_with_both_results_and_changes_nothing(manifest, grads):
    msgs = _messages(manifest, grads, 2)
    site = _site(manifest)
    site.apply(msgs[0][0], "v1")
    before = site.digest
    wrong = dataclasses.replace(msgs[1][0], digest=bytes([7]) * 16)
    with pytest.raises(DivergenceError, match=r"v2: version 2 produced digest [0-9a-f]{32}, message promises (07){16} "
                                              r"\(computed twice: the same again\)"):
        site.apply(wrong, "v2")
    assert site.version == 1 and site.digest == before == site.state.digest()
