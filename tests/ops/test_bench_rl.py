"""`hilo bench rl --quick` (what CI runs of the RL benchmark) against the real vLLM server ops/test.sh started: every
figure is there and plausible, the runs are saved and a rerun reuses them."""
import json

import pytest

from tests.helpers import hilo

# one worker runs every test of group vllm-b, on the second fp32 server (adapter names, its 2 LoRA slots, its CPU)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm-b")]


@pytest.fixture(scope="session")
def vllm(vllm_b):
    """This module's tests (group vllm-b) use the second fp32 server (tests/conftest.py)."""
    return vllm_b


def test_quick_bench_reports_every_figure_and_resumes(vllm, tmp_path):
    url, _ = vllm
    args = ("bench", "rl", "--vllm", f"{url},{url}", "--base", "tiny", "--quick", "--out", str(tmp_path), "--json")
    p = hilo(*args)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    res = json.loads(out)
    rows = {r["staleness"]: r for r in res["rows"]}
    assert set(rows) == {0, 2}
    assert set(rows[0]["staleness_hist"]) == {"0"}                      # S = 0: every sample from the newest policy
    assert {int(k) for k in rows[2]["staleness_hist"]} <= {0, 1, 2}
    for r in rows.values():
        assert sum(r["staleness_hist"].values()) == 3 * 2 * 2          # steps x groups x samples, none dropped
        assert 0 <= r["trainer_idle_fraction"] <= 1 and 0 < r["cpu_busy_fraction"] <= 1 and r["rollouts_per_s"] > 0
        assert r["serve_latency_median_s"] is not None and r["mismatch_kl"] < 1e-3
        assert 0 < r["bytes_per_version"] < r["adapter_bytes"]
    assert rows[0]["wall_ratio_vs_ref"] == [1.0] and len(rows[2]["wall_ratio_vs_ref"]) == 1
    assert (tmp_path / "rl.png").stat().st_size > 0 and len((tmp_path / "runs.jsonl").read_text().splitlines()) == 2

    p = hilo(*args)                                                    # the same folder again: nothing is run
    out2, err = p.communicate(timeout=300)
    assert p.returncode == 0 and "..." not in err, err[-3000:]
    assert json.loads(out2)["rows"] == res["rows"]
