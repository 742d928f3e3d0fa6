"""`hilo rl` end to end with a real vLLM server: a trainer and two generating sites, GRPO steps published, every site
at the trainer's digest; bad options are one line."""
import json
import os
import re
import signal
import subprocess

import pytest

from tests.conftest import KAFKA_URL, new_run
from tests.helpers import hilo, reaped, wait_for_line

# one worker runs every test of the shared vLLM server (adapter names, its 2 LoRA slots, its CPU)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]


def _site(log, run, name, tmp_path, vllm_url, steps, stderr=subprocess.DEVNULL):
    """A generating site of `run` (its own adapter name on the server at `vllm_url`) that exits at v`steps`."""
    return hilo("consume", "--log", log, "--run", run, "--site", name, "--state-dir", str(tmp_path / name), "--vllm",
                vllm_url,
                "--lora-name", f"{run}-{name}", "--export-dtype", "float32", "--generate", "--reward",
                "hilo.ops.digit_task:reward",
                "--generate-batch", "2", "--until-version", str(steps), "--wait-checkpoint", "300", "--no-progress",
                stderr=stderr)


def _finish(trainer, sites) -> tuple:
    """(the trainer's JSON summary, {site: final digest}) once all have exited 0."""
    out, err = trainer.communicate(timeout=600)
    assert trainer.returncode == 0, err[-3000:]
    return json.loads(out), {n: re.search(r"digest ([0-9a-f]{32})", s.communicate(timeout=300)[0]).group(1)
                             for n, s in sites.items()}


def test_an_rl_run_across_two_sites_ends_with_every_site_at_the_trainers_digest(vllm):
    url, _ = vllm
    p = hilo("rl", "--vllm", url, "--steps", "3", "--sites", "2", "--batch-prompts", "2", "--samples", "2",
             "--staleness", "1", "--json")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    res = json.loads(out)
    assert res["ok"] and [r["step"] for r in res["steps"]] == [1, 2, 3]
    assert set(res["site_digests"].values()) == {res["trainer_digest"]} and len(res["site_digests"]) == 2
    # S = 1: at most (1 + 1) * 2 in flight
    assert all(r["staleness"] <= 1 and r["in_flight"] <= 4 for r in res["steps"])
    assert all(0 <= r["reward"] <= 1 and r["mismatch_kl"] >= 0 for r in res["steps"])
    assert 0 <= res["trainer_idle_fraction"] <= 1


def test_a_synchronous_run_answers_every_prompt_with_the_newest_policy_and_wastes_none(vllm):
    # a prompt issued while the current batch completes asks for the next version; it used to be answered with the
    # current one and dropped as stale at the next step
    url, _ = vllm
    # (one site taking 2 of the 4 prompts at a time: the first half of a batch completes while the rest is in flight)
    p = hilo("rl", "--vllm", url, "--steps", "3", "--sites", "1", "--batch-prompts", "4", "--samples", "2",
             "--staleness", "0", "--json")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    res = json.loads(out)
    assert res["dropped"] == {} and all(r["staleness_counts"] == {"0": 8} for r in res["steps"]), res["steps"]


def _refused(argv: list, capsys) -> str:
    """The last line `hilo ARGV` printed to stderr, asserting it exited 1: the CLI's own entry point, in this process
    (a refusal at start needs no interpreter and torch import of its own)."""
    from hilo.ops.cli import main
    assert main(argv) == 1
    err = capsys.readouterr().err
    return err.strip().splitlines()[-1] if err.strip() else err


def test_a_server_on_another_base_is_one_line(vllm, capsys):
    url, base = vllm
    line = _refused(["rl", "--vllm", url, "--base", "student"], capsys)
    assert f"vLLM at {url} serves {base}, not the base 'student' the trainer trains" in line, line


@pytest.mark.parametrize("args, expect", [
    (["--staleness", "-1"], "RLConfig.staleness = -1: must be >= 0"),
    (["--base", "huge"], "base 'huge': expected one of tiny, student"),
    (["--reward", "nowhere.at.all:f"], "--reward 'nowhere.at.all:f': cannot import 'nowhere.at.all'"),
    (["--vllm", "http://127.0.0.1:1"],
     "vLLM at http://127.0.0.1:1: /version: ConnectionError (is the server running?)"),
    ([], "RLConfig.vllm = None: expected the http:// URL of a running vLLM server"),
])
def test_bad_options_are_one_line(args, expect, capsys):
    line = _refused(["rl", *(["--vllm", "http://127.0.0.1:1"] if args and args[0] != "--vllm" else []), *args], capsys)
    assert expect in line, line


def test_a_trainer_killed_mid_publish_and_after_a_commit_trains_no_group_twice_and_loses_no_prompt(vllm, tmp_path):
    url, _ = vllm
    log, run, steps = f"file://{tmp_path}/log", new_run("rlkill"), 6
    trainer = ["rl", "--vllm", url, "--log", log, "--run", run, "--state-dir", str(tmp_path / "trainer"), "--sites",
               "0",
               "--steps", str(steps), "--batch-prompts", "2", "--samples", "2", "--staleness", "1", "--json"]
    sites = {n: _site(log, run, n, tmp_path, url, steps) for n in ("a", "b")}
    with reaped(sites):
        for crash in ("trainer.in-transaction:3", "trainer.committed:2"):  # mid-publish of v3; after its second commit
            p = hilo(*trainer, env=dict(os.environ, HILO_CRASH_AT=crash))
            _, err = p.communicate(timeout=600)
            assert p.returncode == -signal.SIGKILL, err[-2000:]
        p = hilo(*trainer)
        with reaped(p):
            res, digests = _finish(p, sites)
    assert res["version"] == steps and res["restored"]["trained"] >= 2 and set(digests.values()) == {res[
        "trainer_digest"]}
    last = {}
    for line in (tmp_path / "trainer" / "rollouts.jsonl").read_text().splitlines():
        e = json.loads(line)
        last[e["v"]] = e                        # the ledger's rule: the last line of a version wins
    trained = [pid for v in range(1, steps + 1) for pid in last[v]["trained"]]
    retired = {pid for v in range(1, steps + 1) for pid in last[v]["retired"]}
    assert len(trained) == len(set(trained)) == 2 * steps  # no group trained on twice
    # no prompt lost
    assert len(trained) + len(retired) + len(res["in_flight"]) + len(res["complete_unused"]) == res["issued"]


def test_a_site_killed_mid_run_and_restarted_the_run_goes_on(vllm, tmp_path):
    """SIGKILL one of two generating sites at step 2 and start it again: its prompts are answered (by the other site,
    or by it once it is back: it frees its dead incarnation's leases), every site ends at the trainer's digest, and
    the trainer reports its longest wait."""
    url, _ = vllm
    log, run, steps = f"file://{tmp_path}/log", new_run("rlsite"), 5
    sites = {n: _site(log, run, n, tmp_path, url, steps) for n in ("a", "b")}
    trainer = hilo("rl", "--vllm", url, "--log", log, "--run", run, "--sites", "0", "--steps", str(steps),
                   "--batch-prompts", "2",
                   "--samples", "2", "--staleness", "1", "--json")
    with reaped(trainer, sites):
        wait_for_line(trainer, r"^step +2 ", timeout_s=300)
        sites["a"].kill()
        assert sites["a"].wait(timeout=60) == -signal.SIGKILL
        sites["a"] = _site(log, run, "a", tmp_path, url, steps)
        res, digests = _finish(trainer, sites)
    assert res["version"] == steps and set(digests.values()) == {res["trainer_digest"]}
    assert res["longest_wait_s"] == max(r["wait_s"] for r in res["steps"]) > 0


class Gateway:
    """A TCP forwarder in front of the vLLM server that a test can take away: to a site behind it, its vLLM is gone."""

    def __init__(self, upstream: str):
        import socket
        import socketserver
        import threading
        host, port = upstream.rsplit("//", 1)[1].split(":")
        conns = self.conns = []

        class Pipe(socketserver.BaseRequestHandler):
            def handle(self):
                up = socket.create_connection((host, int(port)))
                conns.extend([self.request, up])

                def pump(a, b):
                    try:
                        while data := a.recv(65536):
                            b.sendall(data)
                    except OSError:
                        pass
                    for s in (a, b):
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                t = threading.Thread(target=pump, args=(up, self.request), daemon=True)
                t.start()
                pump(self.request, up)
                t.join()
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Pipe)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        """Refuse new connections and cut the open ones."""
        self.server.shutdown()
        self.server.server_close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


@pytest.mark.kafka
def test_a_sites_vllm_gone_mid_run_the_site_says_so_once_and_the_other_site_carries_the_run(vllm, tmp_path):
    url, _ = vllm
    run, steps, gateway = new_run("rlvllm"), 5, Gateway(url)
    logs = {n: open(tmp_path / f"{n}.log", "w") for n in ("a", "b")}
    sites = {n: _site(KAFKA_URL, run, n, tmp_path, vllm_url, steps, stderr=logs[n])
             for n, vllm_url in (("a", gateway.url), ("b", url))}
    trainer = hilo("rl", "--vllm", url, "--log", KAFKA_URL, "--run", run, "--sites", "0", "--prompt-partitions", "2",
                   "--steps",
                   str(steps), "--batch-prompts", "2", "--samples", "2", "--staleness", "1", "--json")
    with reaped(trainer, sites):
        wait_for_line(trainer, r"^step +2 ", timeout_s=300)
        gateway.close()
        res, digests = _finish(trainer, sites)
    assert res["version"] == steps and set(digests.values()) == {res["trainer_digest"]}  # a kept applying every version
    said = [line for line in (tmp_path / "a.log").read_text().splitlines()
            if "takes no prompts until its vLLM answers again" in line]
    assert len(said) == 1, said
