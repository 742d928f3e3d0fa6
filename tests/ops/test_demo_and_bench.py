"""The two things a newcomer runs first: the demo, and a benchmark's JSON."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import CODECS


@pytest.mark.slow
@pytest.mark.heavy  # a trainer and 3 sites (tests/heavy.py)
@pytest.mark.xdist_group("heavy")
def test_demo_ends_with_every_site_at_the_trainer_digest():
    r = subprocess.run([sys.executable, "-m", "hilo.ops.cli", "demo", "--json", "--steps", "12"], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    assert s["versions"] == 12 and len(s["sites"]) == 3 and s["ok"] is True
    assert {x["digest"] for x in s["sites"]} == {s["trainer_digest"]}
    assert any("SIGKILLed site-2" in e for e in s["events"])
    assert s["bytes_per_step"] <= 0.016 * s["adapter_bytes"]


ROOT = pathlib.Path(__file__).resolve().parents[2]


def measured_here(m: dict) -> None:
    """`m` (a results file's measured_on) names this checkout's commit and this machine."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert (m["commit"], m["recorded"], m["cores"]) == (head, "at run", len(os.sched_getaffinity(0))), m
    assert isinstance(m["dirty"], bool) and m["cpu_model"] != "unknown" and m["triad_gbps"] > 0, m


def test_bench_codecs_json_has_the_documented_keys(capsys):
    from hilo.ops.cli import main
    assert main(["bench", "codecs", "--shapes", "tiny", "--optimizers", "adamw", "--steps", "1", "--budget", "20%",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    measured_here(res["measured_on"])
    rows = res["rows"]
    assert [r["codec"] for r in rows] == list(CODECS)
    for r in rows:
        assert {"codec", "optimizer", "shape", "bytes", "fraction_of_adapter", "encode_ms", "apply_ms",
                "rel_error"} <= set(r)
    dense, spar = rows[CODECS.index("dense")], rows[CODECS.index("spar")]
    assert dense["rel_error"] == 0 and spar["bytes"] < dense["bytes"] and 0 < spar["rel_error"] < 1


def test_bench_scrape_sees_consistent_lag_in_every_scrape(capsys, tmp_path):
    from hilo.ops.cli import main
    assert main(["bench", "scrape", "--shape", "tiny", "--versions", "20", "--every-ms", "5", "--out", str(tmp_path),
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["digest_ok"] and res["scrapes"] >= 1 and res["inconsistent"] == 0  # latency is the full bench's number
    measured_here(res["measured_on"])
    assert 0 < res["p50_ms"] <= res["p99_ms"] <= res["max_ms"]


def test_bench_replay_catches_up_to_the_trainers_digest_and_sizes_each_state(capsys, tmp_path):
    from hilo.ops.cli import main
    assert main(["bench", "replay", "--shape", "tiny", "--behind", "4", "--out", str(tmp_path), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    both = {(r["optimizer"], r["apply"]): r for r in res["rows"]}
    # each replayed to the trainer's digest on both apply paths (the bench raises otherwise)
    assert list(both) == [(o, a) for o in ("adamw", "sgd", "add") for a in ("kernel", "reference")]
    assert res["triad_gbps"] > 0 and res["measured_on"]["triad_gbps"] == res["triad_gbps"]  # the triad it measured
    for r in both.values():
        assert r["versions"] == 4 and r["versions_per_s"] > 0 and 0 < r["message_bytes"] <= 0.016 * r[
            "adapter_bytes_bf16"] + 1100
        assert r["snapshot_save_s"] >= 0 and r["snapshot_load_s"] >= 0 and r["apply_over_floor"] > 0
    rows = {o: r for (o, a), r in both.items() if a == "kernel"}
    # fp32 state per parameter: AdamW 3 (two moments), SGD 2 (momentum), a delta-mode site 1 (the parameters alone)
    assert 2.2 < rows["adamw"]["snapshot_bytes"] / rows["add"]["snapshot_bytes"] < 3.0
    assert 1.5 < rows["sgd"]["snapshot_bytes"] / rows["add"]["snapshot_bytes"] < 2.0


@pytest.mark.slow
def test_bench_ranks_times_both_jobs_and_they_end_at_one_digest(capsys, tmp_path):
    from hilo.ops.cli import main
    assert main(["bench", "ranks", "--shape", "tiny", "--steps", "2", "--rounds", "1", "--out", str(tmp_path),
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["ranks"] for r in res["rows"]] == [1, 2]
    assert res["same_digest"]  # a lone trainer and a 2-rank job, fed the same gradients, publish the same run
    assert len(res["rows"][1]["apply_s_other_ranks"]) == 1 and res["overhead_x"] > 0


@pytest.mark.parametrize("ranks", ["2,4", "1,x", "1,2,2", "1,0"])
def test_bench_ranks_refuses_rank_counts_that_do_not_start_at_one_lone_rank(capsys, ranks):
    from hilo.ops.cli import main
    with pytest.raises(SystemExit) as e:
        main(["bench", "ranks", "--ranks", ranks, "--shape", "tiny"])
    assert e.value.code == 2 and f"--ranks {ranks!r}" in capsys.readouterr().err


def test_bench_pace_follows_a_run_on_schedule_to_the_trainers_digest_and_times_its_snapshots(capsys, tmp_path):
    """The CI-sized pace bench: a `hilo consume` process follows 14 tiny versions, one per 0.2 s; it ends at the
    trainer's digest (the bench raises otherwise), its v10 snapshot is in the history, and the lag is counted."""
    from hilo.ops.cli import main
    assert main(["bench", "pace", "--shape", "tiny", "--versions", "14", "--interval", "0.2", "--out", str(tmp_path),
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["versions"] == 14 and res["log"] == "file" and res["encode_median_s"] > 0
    assert 1 <= res["behind_median"] <= res["behind_max"] <= 14  # the version just appended is behind by definition
    assert 0 < res["freshness_p50_s"] <= res["freshness_p99_s"] <= res["freshness_max_s"]
    assert res["snapshots"] >= 1 and res["snapshot_stall_max_s"] > 0 and res["snapshot_bytes"] > 0
    assert json.loads((tmp_path / "pace.json").read_text()) == res


def test_the_gpu_check_script_passes_on_the_cpu(tmp_path, capsys):
    """ops/gpu/check.py, the device script's body, as written, on this machine's CPU (no GPU here): encode where the
    gradients are, a CPU site at every version's digest, and the tiny model trained through HiLoProducer."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_check",
                                                  pathlib.Path(__file__).resolve().parents[2] / "ops/gpu/check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert check.main(["--device", "cpu", "--shape", "tiny", "--versions", "3", "--steps", "3", "--out",
                       str(tmp_path)]) == 0
    res = json.loads((tmp_path / "gpu-check.json").read_text())
    assert res["ok"] and res["encode"]["device"]["site_matched_versions"] == 3 and res["encode"]["device"][
        "residual_on"] == "cpu"
    assert res["train"]["weights_equal_replica"] and res["train"]["site_digest_equal"]
