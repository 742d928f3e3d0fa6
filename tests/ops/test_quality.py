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
    assert {(c["task"], c["sync"], c["budget"]) for c in cells} == {
        (t, s, b) for t in ("distill", "rl") for s, b in (("full", None), ("spar4", 0.016), ("delta", 0.016))}
    assert {c["optimizer"] for c in cells} == {"adamw", "muon", "lion", "sgd"}
    for c in cells:
        assert {"task", "optimizer", "sync", "seeds", "pass1_mean", "pass4_mean", "pass4_std", "bytes_per_step",
                "fraction_of_adapter"} <= set(c)
        assert c["rollout_digest_equal_versions"] == [c["steps"]] * c["seeds"]  # rollout replica == trainer, every version
        assert 0 <= c["pass1_mean"] <= c["pass4_mean"] <= 1
        if c["sync"] != "full":
            assert c["fraction_of_adapter"] <= 0.016
            assert c["blocks_never_sent"] <= c["blocks_sent_at_most_3"] <= c["blocks"] == 56
            assert 0 < c["residual_ratio"] and -1 <= c["shadow_cosine"] <= 1
        assert (c["lag_mean"] is not None) == (c["sync"] == "delta")
        if c["sync"] == "full":
            assert c["shadow_cosine"] > 0.999 and c["blocks_never_sent"] == 0
    assert res["lossless_delta_bytes_per_step"] > 25 * max(c["bytes_per_step"] for c in cells if c["sync"] == "spar4")
    for p in res["plots"]:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # 8 steps of distillation already pull the held-out reverse KL below the untrained student's
    assert all(c["kl_mean"] < res["untrained"]["kl"] for c in cells if c["task"] == "distill")

    # Rerunning into the same folder resumes: every run comes from runs.jsonl, none is recomputed (nothing appended)
    saved = (tmp_path / "runs.jsonl").read_bytes()
    assert len(saved.splitlines()) == len(cells)
    assert main(SweepConfig(quick=True), as_json=True, out_dir=str(tmp_path)) == 0
    again = json.loads(capsys.readouterr().out)
    assert (tmp_path / "runs.jsonl").read_bytes() == saved
    assert [c["pass4_mean"] for c in again["cells"]] == [c["pass4_mean"] for c in cells]
    assert main(SweepConfig(quick=True, saved_only=True), as_json=True, out_dir=str(tmp_path)) == 0
    assert [c["kl_mean"] for c in json.loads(capsys.readouterr().out)["cells"]] == [c["kl_mean"] for c in cells]


@pytest.mark.slow
def test_saved_only_with_nothing_saved_is_a_named_error_not_a_crash(tmp_path):
    from hilo.ops.bench.quality import SweepConfig, main
    from hilo.schemas.errors import ConfigError
    with pytest.raises(ConfigError, match=f"no finished cell in {tmp_path / 'runs.jsonl'}"):
        main(SweepConfig(quick=True, saved_only=True), as_json=True, out_dir=str(tmp_path))


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
    assert set(by) == {("full", None), ("spar", 0.004), ("spar", 0.064)}  # --budgets overrides PLAN for every lossy sync
    small, large = by[("spar", 0.004)], by[("spar", 0.064)]
    assert small["fraction_of_adapter"] <= 0.004 < large["fraction_of_adapter"] <= 0.064
    assert "spar @0.4%" in table(res) and "spar @6.4%" in table(res)
    assert "| full pass@4 | spar @0.4% | spar @6.4% |" in summary(res)


def test_vs_full_is_the_paired_difference_with_a_95_percent_t_interval():
    from hilo.ops.bench.quality import paired, summary, vs_full
    full = {"task": "rl", "optimizer": "sgd", "sync": "full", "budget": None, "pass4_mean": 0.5, "seed_ids": [0, 1, 2],
            "pass4_seeds": [0.40, 0.50, 0.60]}
    spar = {"task": "rl", "optimizer": "sgd", "sync": "spar", "budget": 0.016, "pass4_mean": 0.47, "seed_ids": [0, 1, 2],
            "pass4_seeds": [0.38, 0.47, 0.56]}
    p = paired(spar, full)
    # per-seed differences -0.02, -0.03, -0.04: mean -0.03, SE 0.01/sqrt(3); the seed-to-seed spread of 0.1 cancels
    assert p["diff"] == pytest.approx(-0.03) and p["se"] == pytest.approx(0.01 / 3 ** 0.5) and p["n"] == 3
    assert p["ci95"] == pytest.approx([-0.03 - 4.303 * 0.01 / 3 ** 0.5, -0.03 + 4.303 * 0.01 / 3 ** 0.5])
    spar["vs_full_pass4"] = p
    assert vs_full(spar) == "-3.0 [-5.5, -0.5]"
    assert paired({**spar, "seed_ids": [0, 7, 8]}, full) is None  # one shared seed: no interval
    assert vs_full({**spar, "vs_full_pass4": None}) == "n/a"
    assert summary({"cells": [full, spar]}).splitlines()[-1] == "| rl | sgd | 0.500 | -3.0 [-5.5, -0.5] |"


def test_fidelity_averages_each_method_over_its_pairs_and_leaves_full_sync_out():
    from hilo.ops.bench.quality import fidelity
    base = {"budget": 0.016, "blocks": 56, "lag_mean": None, "blocks_sent_at_most_3": 2.0, "residual_ratio": 1.0}
    cells = [{**base, "sync": "full", "budget": None, "bytes_per_step": 9e5, "shadow_cosine": 1.0, "blocks_never_sent": 0.0},
             {**base, "sync": "spar4", "bytes_per_step": 7000, "shadow_cosine": 0.6, "blocks_never_sent": 1.0},
             {**base, "sync": "spar4", "bytes_per_step": 8000, "shadow_cosine": 0.8, "blocks_never_sent": 3.0},
             {**base, "sync": "delta", "bytes_per_step": 7500, "shadow_cosine": 0.99, "blocks_never_sent": 0.0, "lag_mean": 0.05}]
    rows = fidelity({"cells": cells}).splitlines()[2:]
    assert rows == ["| spar4 @1.6% | 2 | 7,500 | 0.70 | 2.0 / 56 | 2.0 | 1.00 |  |",
                    "| delta @1.6% | 1 | 7,500 | 0.99 | 0.0 / 56 | 2.0 | 1.00 | 0.050 |"]


def test_every_lossy_cell_tunes_on_three_rates_around_full_syncs():
    from hilo.ops.bench.quality import LADDER, LR_GRID, PLAN, SweepConfig, lossy_grid
    for opt, grid in LR_GRID.items():
        for lr in grid:
            g = lossy_grid(lr)
            assert len(g) == 3 and g[1] == lr and set(g) <= set(LADDER), (opt, lr, g)
    cells = SweepConfig().cells()
    assert cells[0] == ("full", None) and cells[1][1] == 0.016  # the target budget before the others
    assert set(cells) == {(s, b) for s, bs in PLAN.items() for b in bs}
    assert SweepConfig(quick=True).cells() == [("full", None), ("spar4", 0.016), ("delta", 0.016)]


def test_lossless_delta_reconstructs_exactly():
    from hilo.ops.bench.baselines import apply_lossless_delta, bf16_flat, lossless_delta_payload
    gen = torch.Generator().manual_seed(1)
    old = [torch.randn(32, 16, generator=gen), torch.randn(8, 32, generator=gen)]
    new = [t + (torch.rand(t.shape, generator=gen) < 0.3) * torch.randn(t.shape, generator=gen) for t in old]
    got = apply_lossless_delta(bf16_flat(old), lossless_delta_payload(old, new))
    assert torch.equal(got.view(torch.int16), bf16_flat(new).view(torch.int16))
