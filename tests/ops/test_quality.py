"""The quality benchmark's smoke run (what `hilo bench quality --quick` does) and its measuring parts."""
import itertools
import json

import pytest
import torch

from hilo.ops.bench.onpolicy import lossless_delta_bytes, pass_at_k, reverse_kl


def test_pass_at_k_is_the_chance_that_k_of_n_samples_hold_a_correct_one():
    correct = torch.tensor([[1, 0, 0, 0, 0, 1, 0, 0], [0] * 8, [1] * 8, [0, 0, 0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    for k in (1, 2, 4):
        subsets = list(itertools.combinations(range(8), k))
        brute = [sum(bool(row[list(c)].any()) for c in subsets) / len(subsets) for row in correct]
        assert pass_at_k(correct, k) == pytest.approx(sum(brute) / len(brute))
    assert pass_at_k(correct, 1) == pytest.approx(correct.float().mean().item())


def test_reverse_kl_is_zero_only_for_equal_distributions():
    a = torch.randn(3, 4, 14)
    assert torch.allclose(reverse_kl(a, a + 5.0), torch.zeros(3, 4), atol=1e-6)  # softmax is shift-invariant
    assert (reverse_kl(a, torch.randn(3, 4, 14)) > 0).all()


def test_lossless_delta_counts_changed_bf16_elements():
    old = [torch.zeros(64, 64), torch.zeros(10)]
    same = lossless_delta_bytes(old, [t.clone() for t in old])
    changed = [old[0].clone(), old[1].clone()]
    changed[0].view(-1)[torch.randperm(4096, generator=torch.Generator().manual_seed(0))[:500]] = torch.randn(500)
    assert lossless_delta_bytes(old, changed) > same + 500  # 500 values of 2 bytes cannot compress to nothing


@pytest.mark.slow
def test_quick_quality_run(tmp_path, capsys):
    from hilo.ops.bench.quality import SweepConfig, main
    assert main(SweepConfig(quick=True), as_json=True, out_dir=str(tmp_path)) == 0
    res = json.loads(capsys.readouterr().out)
    cells = res["cells"]
    assert {(c["task"], c["sync"]) for c in cells} == {(t, s) for t in ("distill", "rl") for s in ("full", "spar")}
    assert {c["optimizer"] for c in cells} == {"adamw", "muon", "lion", "sgd"}
    for c in cells:
        assert {"task", "optimizer", "sync", "seeds", "pass1_mean", "pass4_mean", "pass4_std", "bytes_per_step",
                "fraction_of_adapter"} <= set(c)
        assert c["rollout_digest_equal_versions"] == [c["steps"]] * c["seeds"]  # rollout replica == trainer, every version
        assert 0 <= c["pass1_mean"] <= c["pass4_mean"] <= 1
        if c["sync"] == "spar":
            assert c["fraction_of_adapter"] <= 0.016
    assert res["lossless_delta_bytes_per_step"] > 17 * max(c["bytes_per_step"] for c in cells if c["sync"] == "spar")
    for p in res["plots"]:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # 8 steps of distillation already pull the held-out reverse KL below the untrained student's
    assert all(c["kl_mean"] < res["untrained"]["kl"] for c in cells if c["task"] == "distill")

    # Rerunning into the same folder resumes: every run comes from runs/, none is recomputed
    saved = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").iterdir()}
    assert len(saved) == len(cells)
    assert main(SweepConfig(quick=True), as_json=True, out_dir=str(tmp_path)) == 0
    again = json.loads(capsys.readouterr().out)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").iterdir()} == saved
    assert [c["pass4_mean"] for c in again["cells"]] == [c["pass4_mean"] for c in cells]
    assert main(SweepConfig(quick=True, saved_only=True), as_json=True, out_dir=str(tmp_path)) == 0
    assert [c["kl_mean"] for c in json.loads(capsys.readouterr().out)["cells"]] == [c["kl_mean"] for c in cells]


@pytest.mark.parametrize("field, value", [("workers", 0), ("steps", 0), ("seeds", -1), ("tasks", ("distill", "sft")),
                                          ("optimizers", ()), ("syncs", ("spar", "zip")), ("budgets", (0.016, 0.0))])
def test_sweep_config_names_the_bad_field(field, value):
    from hilo.ops.bench.quality import SweepConfig
    from hilo.schemas.errors import ConfigError
    with pytest.raises(ConfigError, match=field):
        SweepConfig(**{field: value})


@pytest.mark.slow
def test_budgets_give_each_lossy_sync_one_cell_per_budget(tmp_path, capsys):
    from hilo.ops.bench.quality import SweepConfig, main, summary, table
    cfg = SweepConfig(quick=True, steps=2, tasks=("distill",), optimizers=("sgd",), syncs=("full", "spar"),
                      budgets=(0.004, 0.064), workers=1)
    assert main(cfg, as_json=True, out_dir=str(tmp_path)) == 0
    res = json.loads(capsys.readouterr().out)
    by = {(c["sync"], c["budget"]): c for c in res["cells"]}
    assert set(by) == {("full", None), ("spar", 0.004), ("spar", 0.064)}
    small, large = by[("spar", 0.004)], by[("spar", 0.064)]
    assert small["fraction_of_adapter"] <= 0.004 < large["fraction_of_adapter"] <= 0.064
    assert "spar @0.4%" in table(res) and "spar @6.4%" in table(res)
    assert "| full pass@4 | spar @0.4% | spar @6.4% |" in summary(res)


def test_vs_full_reports_the_difference_with_its_standard_error():
    from hilo.ops.bench.quality import summary, vs_full
    full = {"task": "rl", "optimizer": "sgd", "sync": "full", "budget": None, "pass4_mean": 0.5, "pass4_seeds": [0.5, 0.5, 0.5]}
    spar = {"task": "rl", "optimizer": "sgd", "sync": "spar", "budget": 0.016, "pass4_mean": 0.47, "pass4_seeds": [0.46, 0.47, 0.48]}
    assert vs_full(spar, full) == "-3.0 +- 0.6"     # sqrt(0.01^2 / 3) = 0.0058
    assert vs_full(full, full) == "+0.0"
    assert vs_full(spar, None) == "n/a"
    assert summary({"cells": [full, spar]}).splitlines()[-1] == "| rl | sgd | 0.500 | -3.0 +- 0.6 |"


def test_lossless_delta_reconstructs_exactly():
    from hilo.ops.bench.baselines import apply_lossless_delta, bf16_flat, lossless_delta_payload
    gen = torch.Generator().manual_seed(1)
    old = [torch.randn(32, 16, generator=gen), torch.randn(8, 32, generator=gen)]
    new = [t + (torch.rand(t.shape, generator=gen) < 0.3) * torch.randn(t.shape, generator=gen) for t in old]
    got = apply_lossless_delta(bf16_flat(old), lossless_delta_payload(old, new))
    assert torch.equal(got.view(torch.int16), bf16_flat(new).view(torch.int16))
