"""`hilo doctor --vllm` against the real vLLM server ops/test.sh starts (the tiny Qwen3 base, max LoRA rank 16): a ready
server passes, the plugin check loads a site's own adapter and unloads it, and what can be provoked without
restarting the shared server FAILs: a URL where nothing listens, a base other than `--base`, an adapter the server
refuses. (A server without runtime LoRA loading: tests/consumer/test_vllm.py, on the second server it starts.)"""
import json
import socket

import pytest
import requests

from hilo.ops.cli import main
from hilo.producer.producer import HiLoProducer
from tests.conftest import new_run, producer_config, publish_random
from tests.helpers import open_site

# one worker runs every test of the shared vLLM server (adapter names, its 2 LoRA slots, its CPU)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]
QUICK = ["--skip", "kernels,cpu,disk"]


def doctor(capsys, *args) -> tuple:
    """(exit code, {check: (status, found, fix)}) of `hilo doctor ARGS --json` in this process (one line per vLLM
    check)."""
    code = main(["doctor", *args, *QUICK, "--json"])
    return code, {r["check"]: (r["status"], r["found"], r["fix"]) for r in json.loads(capsys.readouterr().out)}


def exported_site(tmp_path, rank: int) -> str:
    """The state dir of a site that applied v1 of a tiny-Qwen3 run at LoRA `rank` and exported its adapter (no vLLM)."""
    from hilo.ops.tiny_trainer import build_model
    url, run = f"file://{tmp_path}/log", new_run("doctor")
    producer = HiLoProducer.open(build_model(seed=0, rank=rank), producer_config(run=run, log=url))
    publish_random(producer, 1)
    site = open_site(url, run, tmp_path, until_version=1, export_dtype="float32")
    assert site.run(progress=False) == 1
    producer.close()
    return str(tmp_path / "s")


def test_a_ready_server_passes_and_the_plugin_answers_a_load_of_the_sites_adapter(vllm, tmp_path, capsys):
    url, base = vllm
    state = exported_site(tmp_path, rank=16)
    code, rows = doctor(capsys, "--vllm", url, "--base", base, "--state-dir", state)
    assert code == 0 and list(rows) == ["vllm", "vllm-lora", "vllm-plugin", "vllm-base"]
    assert rows["vllm"] == ("OK", f"vLLM 0.32.0 at {url}", "")  # the release ops/vllm/env.sh installs
    assert rows["vllm-lora"][0] == "OK"
    assert rows["vllm-plugin"] == ("OK", f"the hilo-sync plugin answered a load of {tmp_path}/s/adapters/v00000001", "")
    assert rows["vllm-base"] == ("OK", f"serves {base} (as --base says)", "")
    names = [m["id"] for m in requests.get(f"{url}/v1/models", timeout=10).json()["data"]]
    assert "hilo-doctor" not in names  # the probe was unloaded


def test_a_server_serving_another_base_or_none_at_all_fails(vllm, capsys):
    url, base = vllm
    code, rows = doctor(capsys, "--vllm", url, "--base", "/models/Qwen3-1.7B")
    status, found, fix = rows["vllm-base"]
    assert code == 1 and status == "FAIL" and found.startswith(f"vLLM at {url} serves {base}, not the base "
                                                               f"/models/Qwen3-1.7B")
    assert "ops/vllm/start.sh BASE_MODEL_DIR" in fix and rows["vllm"][0] == "OK"
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{s.getsockname()[1]}"
    code, rows = doctor(capsys, "--vllm", nowhere)
    assert code == 1 and rows["vllm"][0] == "FAIL" and "(is the server running?)" in rows["vllm"][1]
    assert "start the server or fix --vllm" in rows["vllm"][2]
    assert [rows[c][0] for c in ("vllm-lora", "vllm-plugin", "vllm-base")] == ["SKIP", "SKIP", "SKIP"]


def test_an_adapter_the_server_refuses_fails_the_plugin_check(vllm, tmp_path, capsys):
    url, _ = vllm
    state = exported_site(tmp_path, rank=32)  # the server takes rank 16 at most
    code, rows = doctor(capsys, "--vllm", url, "--state-dir", state)
    status, found, fix = rows["vllm-plugin"]
    assert code == 1 and status == "FAIL" and "LoRA rank 32 is greater than max_lora_rank 16" in found
    assert "(this site's newest adapter)" in found and "--max-lora-rank" in fix
    assert requests.get(f"{url}/v1/models", timeout=10).status_code == 200  # and the server lives on
