"""Each optimizer against a reference of the textbook rule: 50 steps on decoded gradients, 1e-6 relative."""
import pytest
import torch

from hilo.replica.optimizers import get_optimizer
from tests.conftest import LR

STEPS = 50


def _run_ours(name, params, grads, h):
    opt = get_optimizer(name)
    h = opt.check_hparams(opt.defaults() | h, "test")
    slots = {s: [torch.zeros_like(p) for p in params] for s in opt.slots}
    scalars = opt.init_scalars()
    for g in grads:
        params, slots, scalars = opt.step(params, g, slots, scalars, h)
    return params


def _run_torch_optim(cls, params, grads, **kw):
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    opt = cls(ps, foreach=False, **kw)
    for g in grads:
        for p, gi in zip(ps, g):
            p.grad = gi.clone()
        opt.step()
    return [p.detach() for p in ps]


def _lion_reference(params, grads, lr, beta1, beta2, weight_decay):
    """lion-pytorch's update, written with the fused ops it uses."""
    ps, ms = [p.clone() for p in params], [torch.zeros_like(p) for p in params]
    for g in grads:
        for p, m, gi in zip(ps, ms, g):
            p.mul_(1 - lr * weight_decay)
            p.add_(m.clone().lerp_(gi, 1 - beta1).sign_(), alpha=-lr)
            m.lerp_(gi, 1 - beta2)
    return ps


def _newton_schulz_reference(G, steps=5):
    """Keller Jordan's zeropower_via_newtonschulz5, fp32."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.float()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = torch.addmm(A, A, A, beta=b, alpha=c)
        X = torch.addmm(X, B, X, beta=a)
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def _muon_reference(params, grads, lr, momentum, weight_decay):
    ps, bufs = [p.clone() for p in params], [torch.zeros_like(p) for p in params]
    for g in grads:
        for p, b, gi in zip(ps, bufs, g):
            b.mul_(momentum).add_(gi)
            u = gi.add(b, alpha=momentum)
            p.mul_(1 - lr * weight_decay)
            p.add_(_newton_schulz_reference(u), alpha=-lr * max(1, p.size(-2) / p.size(-1)) ** 0.5)
    return ps


def _rel(a, b):
    return max(float((x - y).norm() / y.norm()) for x, y in zip(a, b))


@pytest.fixture
def problem(manifest, grads):
    params = [torch.randn(b.shape, generator=torch.Generator().manual_seed(i)) * 0.05
              for i, b in enumerate(manifest.blocks)]
    return params, [grads.next() for _ in range(STEPS)]


CASES = [
    ("sgd", lambda p, g: _run_torch_optim(torch.optim.SGD, p, g, lr=LR["sgd"], momentum=0.9, weight_decay=0.01),
     {"lr": LR["sgd"], "momentum": 0.9, "weight_decay": 0.01}),
    ("sgd-nesterov", lambda p, g: _run_torch_optim(torch.optim.SGD, p, g, lr=LR["sgd"], momentum=0.9, nesterov=True),
     {"lr": LR["sgd"], "momentum": 0.9, "nesterov": 1.0}),
    ("adamw", lambda p,
     g: _run_torch_optim(torch.optim.AdamW, p, g, lr=LR["adamw"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1),
     {"lr": LR["adamw"], "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1}),
    ("lion", lambda p, g: _lion_reference(p, g, LR["lion"], 0.9, 0.99, 0.1),
     {"lr": LR["lion"], "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.1}),
    ("muon", lambda p, g: _muon_reference(p, g, LR["muon"], 0.95, 0.01),
     {"lr": LR["muon"], "momentum": 0.95, "weight_decay": 0.01}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_textbook_rule(problem, case):
    name, reference, h = case
    params, grads = problem
    ours = _run_ours(name.split("-")[0], params, grads, h)
    ref = reference(params, grads)
    assert _rel(ours, params) > 1e-3, "the optimizer barely moved the parameters; the comparison would be vacuous"
    assert _rel(ours, ref) <= 1e-6


def test_rejects_bad_hyperparameters():
    opt = get_optimizer("adamw")
    with pytest.raises(Exception, match=r"hparams\['beta1'\] = 1.0 is outside"):
        opt.check_hparams(opt.defaults() | {"beta1": 1.0}, "v3")
    with pytest.raises(Exception, match=r"unknown adamw hyperparameter\(s\) \['momentum'\]"):
        opt.check_hparams(opt.defaults() | {"momentum": 0.9}, "v3")
    with pytest.raises(Exception, match="missing field 'lr'"):
        opt.check_hparams({k: v for k, v in opt.defaults().items() if k != "lr"}, "v3")
