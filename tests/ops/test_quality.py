"""The quality benchmark's smoke run (what `hilo bench quality --quick` does) and its measuring parts."""
import dataclasses
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
@pytest.mark.heavy  # a pool of 2 processes (tests/heavy.py)
@pytest.mark.xdist_group("heavy")
def test_quick_quality_run(tmp_path, capsys):
    from hilo.ops.pretrain import SMOKE_STUDENT
    from hilo.ops.bench.quality import SweepConfig, main
    # `--quick`'s plan (both tasks, every quick sync) at one optimizer and 4 steps: the suite's share of its time (a
    # second optimizer doubled the suite's longest test; the optimizers' arithmetic has tests of its own)
    cfg = SweepConfig(quick=True, optimizers=("adamw",), steps=4, student="smoke")
    assert main(cfg, as_json=True, out_dir=str(tmp_path)) == 0
    res = json.loads(capsys.readouterr().out)
    cells = res["cells"]
    assert {(c["task"], c["sync"], c["budget"]) for c in cells} == {
        (t, s, b) for t in ("distill", "rl") for s, b in (("full", None), ("spar4", 0.016), ("delta", 0.016))}
    assert {c["optimizer"] for c in cells} == set(cfg.optimizers)
    for c in cells:
        assert {"task", "optimizer", "sync", "seeds", "pass1_mean", "pass4_mean", "pass4_std", "bytes_per_step",
                "fraction_of_adapter"} <= set(c)
        # rollout replica == trainer, every version
        assert c["rollout_digest_equal_versions"] == [c["steps"]] * c["seeds"]
        assert 0 <= c["pass1_mean"] <= c["pass4_mean"] <= 1
        if c["sync"] != "full":
            assert c["fraction_of_adapter"] <= 0.016
            # 7 LoRA A, B
            assert c["blocks_never_sent"] <= c["blocks_sent_at_most_3"] <= c["blocks"] == 14 * SMOKE_STUDENT.layers
            assert 0 < c["residual_ratio"] and -1 <= c["shadow_cosine"] <= 1
        assert (c["lag_mean"] is not None) == (c["sync"] == "delta")
        if c["sync"] == "full":
            assert c["shadow_cosine"] > 0.999 and c["blocks_never_sent"] == 0
    assert res["lossless_delta_bytes_per_step"] > 25 * max(c["bytes_per_step"] for c in cells if c["sync"] == "spar4")
    for p in res["plots"]:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # 4 steps of distillation already pull the held-out reverse KL below the untrained student's
    assert all(c["kl_mean"] < res["untrained"]["kl"] for c in cells if c["task"] == "distill")

    # Rerunning into the same folder resumes: every run comes from runs.jsonl, none is recomputed (nothing appended)
    saved = (tmp_path / "runs.jsonl").read_bytes()
    assert len(saved.splitlines()) == len(cells)
    assert main(cfg, as_json=True, out_dir=str(tmp_path)) == 0
    again = json.loads(capsys.readouterr().out)
    assert (tmp_path / "runs.jsonl").read_bytes() == saved
    assert [c["pass4_mean"] for c in again["cells"]] == [c["pass4_mean"] for c in cells]
    assert main(dataclasses.replace(cfg, saved_only=True), as_json=True, out_dir=str(tmp_path)) == 0
    assert [c["kl_mean"] for c in json.loads(capsys.readouterr().out)["cells"]] == [c["kl_mean"] for c in cells]


@pytest.mark.slow
def test_saved_only_with_nothing_saved_is_a_named_error_not_a_crash(tmp_path):
    from hilo.ops.bench.quality import SweepConfig, main
    from hilo.schemas.errors import ConfigError
    with pytest.raises(ConfigError, match=f"no finished cell in {tmp_path / 'runs.jsonl'}"):
        main(SweepConfig(quick=True, saved_only=True), as_json=True, out_dir=str(tmp_path))


@pytest.mark.parametrize("field, value", [("workers", 0), ("steps", 0), ("seeds", -1), ("tasks", ("distill", "sft")),
                                          ("optimizers", ()), ("syncs", ("spar", "zip")), ("budgets", (0.016, 0.0)),
                                          ("student", "h1024-l32"), ("lrs_from", "/nonexistent/quality.json")])
def test_sweep_config_names_the_bad_field(field, value):
    from hilo.ops.bench.quality import SweepConfig
    from hilo.schemas.errors import ConfigError
    with pytest.raises(ConfigError, match=field):
        SweepConfig(**{field: value})


@pytest.mark.slow
@pytest.mark.heavy  # a pool of 2 processes (tests/heavy.py)
@pytest.mark.xdist_group("heavy")
def test_budgets_give_each_lossy_sync_one_cell_per_budget(tmp_path, capsys):
    from hilo.ops.bench.quality import SweepConfig, main, summary, table
    cfg = SweepConfig(quick=True, steps=2, tasks=("distill",), optimizers=("sgd",), syncs=("full", "spar"),
                      budgets=(0.004, 0.064), workers=1, student="smoke")
    assert main(cfg, as_json=True, out_dir=str(tmp_path)) == 0
    res = json.loads(capsys.readouterr().out)
    by = {(c["sync"], c["budget"]): c for c in res["cells"]}
    # --budgets overrides PLAN for every lossy sync
    assert set(by) == {("full", None), ("spar", 0.004), ("spar", 0.064)}
    small, large = by[("spar", 0.004)], by[("spar", 0.064)]
    assert small["fraction_of_adapter"] <= 0.004 < large["fraction_of_adapter"] <= 0.064
    assert "spar @0.4%" in table(res) and "spar @6.4%" in table(res)
    assert "| full pass@4 | spar @0.4% | spar @6.4% |" in summary(res)


def test_vs_full_is_the_paired_difference_with_a_95_percent_t_interval():
    from hilo.ops.bench.quality import paired, summary, vs_full
    full = {"task": "rl", "optimizer": "sgd", "sync": "full", "budget": None, "pass4_mean": 0.5, "seed_ids": [0, 1, 2],
            "pass4_seeds": [0.40, 0.50, 0.60]}
    spar = {"task": "rl", "optimizer": "sgd", "sync": "spar", "budget": 0.016, "pass4_mean": 0.47,
            "seed_ids": [0, 1, 2],
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
    cells = [{**base, "sync": "full", "budget": None, "bytes_per_step": 9e5, "shadow_cosine": 1.0,
              "blocks_never_sent": 0.0},
             {**base, "sync": "spar4", "bytes_per_step": 7000, "shadow_cosine": 0.6, "blocks_never_sent": 1.0},
             {**base, "sync": "spar4", "bytes_per_step": 8000, "shadow_cosine": 0.8, "blocks_never_sent": 3.0},
             {**base, "sync": "delta", "bytes_per_step": 7500, "shadow_cosine": 0.99, "blocks_never_sent": 0.0,
              "lag_mean": 0.05}]
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


def test_tuning_rule_never_picks_the_rate_below_a_collapse():
    from hilo.ops.bench.quality import COLLAPSE_MARGIN, choose_rate
    from hilo.schemas.errors import ConfigError
    floor = 0.20
    # 3e-3 has the best mean, but 0.01 collapses on one seed of three: 3e-3 is not eligible, 1e-3 is chosen
    assert choose_rate({1e-3: [0.30, 0.31, 0.29], 3e-3: [0.33, 0.34, 0.32], 0.01: [0.30, 0.05, 0.31]}, floor,
                       1e-3) == (1e-3, None)
    # the same scores with 0.01 stable on every seed (within the margin of the floor): 3e-3 wins
    assert choose_rate({1e-3: [0.30, 0.31, 0.29], 3e-3: [0.33, 0.34, 0.32],
                        0.01: [0.30, floor - COLLAPSE_MARGIN / 2, 0.31]},
                       floor, 1e-3) == (3e-3, None)
    # the grid's top would win but the rate above it was never run: ask for it before choosing
    assert choose_rate({1e-3: [0.30, 0.31, 0.29], 3e-3: [0.33, 0.34, 0.32]}, floor, 1e-3) == (None, 0.01)
    # a non-finite score is a collapse too; nothing eligible: ask for the rate below the smallest, down to two below
    # the grid, then give up naming why
    assert choose_rate({1e-3: [0.30, float("nan"), 0.29], 3e-3: [0.10, 0.1, 0.1]}, floor, 1e-3) == (None, 3e-4)
    assert choose_rate({3e-4: [0.1] * 3, 1e-3: [0.1] * 3, 3e-3: [0.1] * 3}, floor, 1e-3) == (None, 1e-4)
    with pytest.raises(ConfigError, match="every rate from 0.0001 up collapses"):
        choose_rate({1e-4: [0.1] * 3, 3e-4: [0.1] * 3, 1e-3: [0.1] * 3, 3e-3: [0.1] * 3}, floor, 1e-3)
    # a tie goes to the smaller rate
    assert choose_rate({1e-3: [0.3] * 3, 3e-3: [0.3] * 3, 0.01: [0.25] * 3}, floor, 1e-3) == (1e-3, None)


def test_a_run_is_identified_by_its_base_models_weights_not_only_their_specs():
    from hilo.ops.bench.onpolicy import RunConfig
    from hilo.ops.pretrain import weights_digest
    from hilo.ops.bench.quality import _run_id
    from hilo.ops.tiny_trainer import build_base
    a, b = build_base(seed=1, hidden=32, layers=1), build_base(seed=1, hidden=32, layers=1)
    assert weights_digest(a) == weights_digest(b)          # the same weights hash the same in any process
    with torch.no_grad():
        next(b.parameters()).view(-1)[0] += 1e-6            # one value of another training run
    assert weights_digest(a) != weights_digest(b)
    cfg = RunConfig("rl", "muon", "spar4", 1e-3, seed=1000)
    ida = _run_id(cfg, {"student": weights_digest(a), "teacher": "t"})
    assert ida == _run_id(cfg, {"student": weights_digest(a), "teacher": "t"})
    # saved runs of the other student never match
    assert ida != _run_id(cfg, {"student": weights_digest(b), "teacher": "t"})


@pytest.mark.slow
def test_probe_sees_full_sync_step_exactly_as_the_shadow_and_spar4_part_from_it():
    from hilo.ops.bench.probe import ProbeConfig, probe
    full = probe(ProbeConfig(task="distill", optimizers=("muon",), lrs=(1e-3,), sync="full", seeds=(1000,), steps=3,
                                eval_problems=64, student="smoke"), lambda *a: None)
    m = full["optimizers"]["muon"]
    # dense fp32 gradients: the replica's step is the shadow's step (every block with a gradient is sent: all but
    # LoRA's A blocks at the first version, whose gradient is zero while B is still zero)
    assert m["sent_fraction"] == pytest.approx(1 - 0.5 / 3) and m["block_rank"] == 16
    assert m["step_cosine_sent"] == pytest.approx(1.0, abs=1e-6) and m["norm_ratio_sent"] == pytest.approx(1.0,
                                                                                                           abs=1e-6)
    assert m["residual_ratio_mean"] == 0.0
    lossy = probe(ProbeConfig(task="distill", optimizers=("muon",), lrs=(1e-3,), sync="spar4", seeds=(1000,), steps=3,
                                 eval_problems=64, student="smoke"), lambda *a: None)
    s = lossy["optimizers"]["muon"]
    assert s["decoded_rank_sent"] < m["decoded_rank_sent"] and s["step_cosine_sent"] < 0.99 and s[
        "residual_ratio_mean"] > 0
    assert len(s["runs"][0]["residual_by_version"]) == 3


@pytest.mark.slow
def test_post_mode_sites_add_the_trainers_compressed_step_and_stay_identical():
    from hilo.ops.bench.onpolicy import RunConfig, run
    from hilo.ops.pretrain import SMOKE_STUDENT, SMOKE_TEACHER, pretrained
    student, teacher = pretrained(SMOKE_STUDENT), pretrained(SMOKE_TEACHER)
    probes = []
    r = run(RunConfig("rl", "muon", "post", 1e-3, seed=1000, steps=3, eval_split="val", eval_samples=4,
                      eval_problems=64),
            student, teacher, probes)
    assert r["rollout_digest_equal_versions"] == 3 and r["lag_mean"] is not None and r["lag_mean"] > 0
    assert r["bytes_per_step"] <= 0.016 * r["adapter_bytes"]
    assert -1 <= r["shadow_cosine"] <= 1 and len(probes) == 3


@pytest.mark.slow
@pytest.mark.heavy  # a pool of 2 processes (tests/heavy.py)
@pytest.mark.xdist_group("heavy")
def test_tuning_runs_every_rate_on_three_seeds_and_records_the_rule(tmp_path, capsys):
    from hilo.ops.bench.quality import LR_GRID, TUNE_SEEDS, SweepConfig, choose_rate, main
    cfg = SweepConfig(steps=2, seeds=1, tasks=("distill",), optimizers=("adamw",), syncs=("full",), workers=2,
                      eval_problems=64, student="smoke")
    assert main(cfg, as_json=True, out_dir=str(tmp_path)) == 0
    res = json.loads(capsys.readouterr().out)
    rows = res["tuning"]
    assert {r["lr"] for r in rows} >= set(LR_GRID["adamw"])
    assert all(len(r["val_pass1_seeds"]) == len(TUNE_SEEDS) for r in rows)
    floor = res["untrained_val"]["pass1"]
    chosen = [r["lr"] for r in rows if r["chosen"]]
    assert chosen == [choose_rate({r["lr"]: r["val_pass1_seeds"] for r in rows}, floor, min(LR_GRID["adamw"]))[0]]
    assert chosen == [res["cells"][0]["lr"]]
    assert len(res["bases"]["student"]) == 64


def test_another_shape_takes_each_cells_rate_from_an_earlier_sweep(tmp_path):
    from hilo.ops.bench.quality import _rate_from
    from hilo.schemas.errors import ConfigError
    q = tmp_path / "quality.json"
    q.write_text(json.dumps({"cells": [{"task": "rl", "optimizer": "muon", "sync": "full", "budget": None, "lr": 0.001},
                                       {"task": "rl", "optimizer": "muon", "sync": "spar4", "budget": 0.016,
                                        "lr": 0.003}]}))
    assert _rate_from(str(q), "rl", "muon", "full", None) == 0.001
    assert _rate_from(str(q), "rl", "muon", "spar4", 0.016) == 0.003
    with pytest.raises(ConfigError, match="no cell rl/muon/spar4@0.01 "):
        _rate_from(str(q), "rl", "muon", "spar4", 0.01)


def test_a_report_of_saved_runs_leaves_out_only_the_cells_whose_tuning_is_unfinished(tmp_path):
    from dataclasses import replace

    from hilo.ops.bench.onpolicy import RunConfig
    from hilo.ops.pretrain import STUDENTS
    from hilo.ops.bench.quality import TUNE_SEEDS, Workers, _run_id, _tune
    from hilo.ops.bench.runstore import RunStore
    store, bases = RunStore(tmp_path), {"student": "s", "teacher": "t"}
    done, half = RunConfig("rl", "muon", "spar4", 1e-3, eval_split="val"), RunConfig("rl", "adamw", "spar4", 1e-3,
                                                                                     eval_split="val")
    grid = (3e-4, 1e-3, 3e-3)
    score = {3e-4: 0.30, 1e-3: 0.33, 3e-3: 0.31, 0.01: 0.05}
    for lr in grid:
        for s in TUNE_SEEDS:
            store.put(_run_id(replace(done, lr=lr, seed=s), bases, STUDENTS["h256-l4"]),
                      {"pass1": score[lr], "pass4": 0.6})
            if lr != 3e-3:
                store.put(_run_id(replace(half, lr=lr, seed=s), bases, STUDENTS["h256-l4"]),
                          {"pass1": score[lr], "pass4": 0.6})
    best, rows, unfinished = _tune({"done": (done, grid), "half": (half, grid)}, store,
                                   Workers(1, STUDENTS["h256-l4"]), False, "t", 0.2, bases)
    assert best == {"done": 1e-3} and [r["lr"] for r in rows if r["chosen"]] == [1e-3]
    assert len(unfinished) == 1 and "rl/adamw/spar4@0.016 lr=0.003" in unfinished[0]
