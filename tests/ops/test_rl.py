"""`hilo rl` end to end with a real vLLM server: a trainer and two generating sites, GRPO steps published, every site
at the trainer's digest; bad options are one line."""
import json

import pytest

from tests.helpers import hilo

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_an_rl_run_across_two_sites_ends_with_every_site_at_the_trainers_digest(vllm):
    url, _ = vllm
    p = hilo("rl", "--vllm", url, "--steps", "3", "--sites", "2", "--batch-prompts", "2", "--samples", "2", "--staleness", "1", "--json")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    res = json.loads(out)
    assert res["ok"] and [r["step"] for r in res["steps"]] == [1, 2, 3]
    assert set(res["site_digests"].values()) == {res["trainer_digest"]} and len(res["site_digests"]) == 2
    assert all(r["staleness"] <= 1 and r["in_flight"] <= 4 for r in res["steps"])  # S = 1: at most (1 + 1) * 2 in flight
    assert all(0 <= r["reward"] <= 1 and r["mismatch_kl"] >= 0 for r in res["steps"])
    assert 0 <= res["trainer_idle_fraction"] <= 1


@pytest.mark.parametrize("args, expect", [
    (["--staleness", "-1"], "RLConfig.staleness = -1: must be >= 0"),
    (["--reward", "nowhere.at.all:f"], "--reward 'nowhere.at.all:f': cannot import 'nowhere.at.all'"),
    (["--vllm", "http://127.0.0.1:1"], "vLLM at http://127.0.0.1:1: /version: ConnectionError (is the server running?)"),
    ([], "RLConfig.vllm = None: expected the http:// URL of a running vLLM server"),
])
def test_bad_options_are_one_line(args, expect):
    p = hilo("rl", *(["--vllm", "http://127.0.0.1:1"] if args and args[0] != "--vllm" else []), *args)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1 and expect in err.strip().splitlines()[-1], err
