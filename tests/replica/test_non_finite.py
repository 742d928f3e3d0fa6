"""A state with NaN/Inf is never adopted, even by a message whose digest chain is right."""
import pytest
import torch

from hilo.replica.codecs import lowrank
from hilo.replica.optimizers import get_optimizer
from hilo.replica.state import ReplicaState
from hilo.schemas.arrays import to_bytes
from hilo.schemas.errors import MalformedMessage
from hilo.schemas.records import UpdateMessage
from tests.conftest import genesis

ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}


def _overflowing_block(manifest, i=0):
    """Finite fp16 factors and a finite fp32 scale whose product is Inf in fp32."""
    m, n = manifest.blocks[i].shape
    return {"i": i, "k": 1, "u": to_bytes(torch.full((1, m), 65504.0, dtype=torch.float16), "float16"),
            "v": to_bytes(torch.full((1, n), 65504.0, dtype=torch.float16), "float16"),
            "s": to_bytes(torch.tensor([3e38]), "float32")}


def test_finite_factors_whose_product_overflows_are_refused_with_a_matching_digest(manifest):
    r = genesis(manifest)
    blocks = [_overflowing_block(manifest)]
    # The forger runs the same step to get the digest right: the chain alone would accept it.
    grads = lowrank.decode(manifest, {}, blocks, "forge", r.limits)
    assert not bool(torch.isfinite(grads[0]).all()) and all(bool(torch.isfinite(g).all()) for g in grads[1:])
    opt = get_optimizer("adamw")
    p, s, sc = opt.step(r.state.params, grads, r.state.slots, r.state.scalars, ADAMW)
    digest = ReplicaState(manifest, "adamw", 1, p, s, sc).digest()
    msg = UpdateMessage(r.run, 1, r.digest, digest, manifest.manifest_id, "spar", {}, "adamw", ADAMW, blocks)
    before = r.digest
    with pytest.raises(MalformedMessage,
                       match=r"version 1 would leave NaN/Inf in the decoded gradient of '.*lora_[AB]'; refused"):
        r.apply_bytes(msg.to_bytes(), "forged")
    assert r.digest == before and r.version == 0


def test_a_learning_rate_finite_in_float64_but_infinite_in_fp32_is_refused(manifest):
    r = genesis(manifest)
    msg = UpdateMessage(r.run, 1, r.digest, bytes(16), manifest.manifest_id, "topk", {}, "adamw", ADAMW | {"lr": 1e39},
                        [])
    with pytest.raises(MalformedMessage, match=r"hparams\['lr'\] = 1e\+39 is infinite as the fp32 value the step uses"):
        r.apply_bytes(msg.to_bytes(), "big lr")
    assert r.version == 0


def test_the_trainer_refuses_a_step_that_would_leave_nan_and_publishes_nothing(tmp_path):
    from hilo.log import open_log, updates_topic
    from hilo.producer.producer import HiLoProducer
    from tests.conftest import producer_config, publish_random, small_model
    url = f"file://{tmp_path}/log"
    producer = HiLoProducer.open(small_model(), producer_config(run="r", log=url, codec="dense"))
    publish_random(producer, 1)
    for p in producer.params:
        p.grad = torch.full(p.shape, 3e38)
    with pytest.raises(MalformedMessage, match=r"would leave NaN/Inf in the optimizer state 'exp_avg_sq'"):
        producer.step(lr=1e-3)  # g*g overflows fp32: AdamW's second moment would be Inf
    assert producer.version == 1 and open_log(url).end_offset(updates_topic("r")) == 1
