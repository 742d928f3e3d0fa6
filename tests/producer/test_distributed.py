"""One run from a multi-rank trainer: 2-rank jobs (gloo on CPU) started as users start them, with torchrun, each rank
running tests/producer/_dist_worker.py (the same code on every rank: a DDP-wrapped tiny PEFT model and HiLoOptimizer),
and a separate `hilo consume` process following the run on a file:// log.

Every rank writes what it holds (its replica's digest, a digest of its model's LoRA params, whether they are the
replica's bit for bit, its state_dict's "hilo" entry, the error lines it raised); the tests compare the ranks with each
other, with the log (one message per version) and with the site. Every job runs under a deadline, in a process group
of its own that is killed if it outlives it.
"""
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys

import msgpack
import pytest
import torch

from hilo.producer.config import ProducerConfig
from hilo.producer.rank_trainer import RankProducer
from hilo.producer.rank_transport import raise_as
from hilo.producer.lora_params import lora_weights
from hilo.producer.optimizer import HiLoOptimizer
from hilo.producer.producer import HiLoProducer
from hilo.producer.trainer import Trainer
from hilo.replica.replica import PolicyReplica
from hilo.schemas.errors import ConfigError, NotPublished, TrainerError
from hilo.schemas.records import decode_record
from tests.conftest import producer_config, small_model
from tests.helpers import reaped
from tests.producer.test_training_loops import Follow, published

pytestmark = pytest.mark.slow
ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = str(pathlib.Path(__file__).with_name("_dist_worker.py"))
SNIPPETS = str(pathlib.Path(__file__).with_name("_snippet_worker.py"))
ACCELERATE_2 = ["accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                "--mixed_precision", "no",
                # `accelerate launch` of 2 processes (--multi_gpu: its multi-process switch, CPU here)
                "--dynamo_backend", "no"]
JOB_S = 300  # a 2-rank job of a few steps takes 15-30 s on a busy 2-core machine


def _env(**extra) -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HILO_CRASH_AT")} | {
        "OMP_NUM_THREADS": "1"} | extra


def _finish(procs: list, what: str) -> list:
    """Wait for `procs` (each in a session of its own) within JOB_S; kill their process groups past it."""
    try:
        return [p.communicate(timeout=JOB_S)[0] for p in procs]
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} did not end within {JOB_S}s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def reports(out: pathlib.Path, world: int = 2) -> list:
    """Each rank's report (None for a rank that wrote none: one that was killed)."""
    return [json.loads(f.read_text()) if (f := out / f"rank{r}.json").exists() else None for r in range(world)]


def launch(launcher: list, script: str, args: list, out: pathlib.Path, world: int = 2, nodes: int = 1, **env) -> tuple:
    """`launcher script args`, once per node (a job of `world` ranks): (exit status, its output, the ranks' reports)."""
    for f in out.glob("rank*.json"):
        f.unlink()
    procs = [subprocess.Popen([sys.executable, "-m", *launcher, script, *map(str, args)], cwd=ROOT,
                              env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for n in range(nodes)]
    outputs = _finish(procs, " ".join(launcher))
    return max(p.returncode for p in procs), "\n".join(outputs), reports(out, world)


def torchrun(scenario: str, url: str, run: str, out: pathlib.Path, steps: int, nproc: int = 2, **env) -> tuple:
    """`torchrun --standalone --nproc_per_node NPROC _dist_worker.py SCENARIO ...`."""
    return launch(["torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)], WORKER,
                  [scenario, url, run, out, steps], out, nproc, **env)


def torchrun_nodes(scenario: str, url: str, run: str, out: pathlib.Path, steps: int, nodes: int = 2) -> tuple:
    """A job of `nodes` nodes x 1 rank, as a multi-node job starts: one torchrun per node, meeting at a c10d
    rendezvous (here every node on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = ["torch.distributed.run", "--nnodes", str(nodes), "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", f"hilo-{port}", "--local_addr", "127.0.0.1"]
    return launch(launcher, WORKER, [scenario, url, run, out, steps], out, nodes, nodes)


def ranks_by_hand(scenario: str, url: str, run: str, out: pathlib.Path, steps: int, **env) -> tuple:
    """The two ranks started directly (RANK, WORLD_SIZE, MASTER_*), no torchrun to stop the survivor when one dies:
    what a rank does on its own. ([exit status per rank], [output per rank], the ranks' reports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, WORKER, scenario, url, run, str(out), str(steps)], cwd=ROOT,
                              env=_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port), **env),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for r in range(2)]
    outputs = _finish(procs, f"the ranks of {scenario}")
    return [p.returncode for p in procs], outputs, reports(out)


def assert_every_rank_holds_the_replica(reps: list, version: int):
    """Every rank's report against rank 0's (the publishing rank's), as assert_ranks_hold_the_replica."""
    for r in reps[1:]:
        assert_ranks_hold_the_replica(reps[0], r, version)


def assert_ranks_hold_the_replica(r0: dict, r1: dict, version: int):
    """Both ranks at `version`, their models' LoRA params the same bytes and each bit-equal to its replica."""
    assert r0["version"] == r1["version"] == version
    assert r0["digest"] == r1["digest"] and r0["params_sha256"] == r1["params_sha256"]
    assert r0["params_are_replica"] and r1["params_are_replica"]
    assert r0["hilo"] == r1["hilo"] == {"run": r0["hilo"]["run"], "version": version, "digest": r0["digest"]}
    assert r0["groups"] == r1["groups"]
    assert r0["has_encoder"] and not r1["has_encoder"]  # error feedback: the publishing rank's alone


def test_a_ddp_job_publishes_through_one_rank_and_a_restart_continues_the_run(tmp_path):
    url, run = f"file://{tmp_path}/log", "ddp"
    follower = Follow(url, run, tmp_path, 5)
    with reaped(follower.proc):
        rc, out, (r0, r1) = torchrun("train", url, run, tmp_path, 3)
        assert rc == 0, out[-4000:]
        assert r0["start_version"] == r1["start_version"] == 0
        assert_ranks_hold_the_replica(r0, r1, 3)
        assert r0["grads_sha256"] == r1["grads_sha256"]  # each rank its own batches, DDP's all-reduced gradients
        msgs = published(url, run)
        assert [m.version for m in msgs] == [1, 2, 3]  # one writer: no fencing, one message per version
        assert [m.hparams["lr"] for m in msgs] == [3e-3 / (1 + s) for s in range(3)]  # the publishing rank's schedule
        # The job again, pipelined (ProducerConfig.pipeline: every rank adopts v while its publish runs): every rank
        # loads rank 0's saved state_dict and continues the run at its head.
        rc, out, (r0, r1) = torchrun("train_pipelined", url, run, tmp_path, 2)
        assert rc == 0, out[-4000:]
        assert r0["start_version"] == r1["start_version"] == 3
        assert_ranks_hold_the_replica(r0, r1, 5)
        assert [m.version for m in published(url, run)] == [1, 2, 3, 4, 5]  # no duplicate, no fork
        assert follower.digest() == r0["digest"]


@pytest.mark.parametrize("job", ["4 ranks", "2 nodes x 1 rank"])
def test_a_larger_job_publishes_through_one_rank_and_every_rank_holds_the_replica(tmp_path, job):
    """The 2-rank job's checks on a 4-rank job, and on 2 nodes of 1 rank each (two torchrun launches, c10d rendezvous):
    one writer, every rank bit-equal to the replica, DDP's gradients the same everywhere, a site at the digest."""
    url, run = f"file://{tmp_path}/log", "larger"
    follower = Follow(url, run, tmp_path, 2)
    with reaped(follower.proc):
        if job == "4 ranks":
            rc, out, reps = torchrun("train", url, run, tmp_path, 2, nproc=4)
        else:
            rc, out, reps = torchrun_nodes("train", url, run, tmp_path, 2)
        assert rc == 0 and all(reps), out[-4000:]
        assert [r["rank"] for r in reps] == list(range(len(reps))) and all(r["start_version"] == 0 for r in reps)
        assert_every_rank_holds_the_replica(reps, 2)
        assert len({tuple(r["grads_sha256"]) for r in reps}) == 1  # each rank its own batches, all-reduced
        assert [m.version for m in published(url, run)] == [1, 2]  # one writer: one message per version
        assert follower.digest() == reps[0]["digest"]


def test_accelerate_in_a_2_rank_job_and_a_step_the_grad_scaler_skips_on_every_rank(tmp_path):
    """Accelerate's own loop (prepare: DDP and a sharded loader; accumulation; clipping); its grad scaler skips the
    first step on both ranks (the all-reduced gradient overflows on both), so that step calls no one's step()."""
    url, run = f"file://{tmp_path}/log", "accel"
    follower = Follow(url, run, tmp_path, 3)
    with reaped(follower.proc):
        rc, out, (r0, r1) = torchrun("accelerate", url, run, tmp_path, 4)
        assert rc == 0, out[-4000:]
        assert r0["skipped"] == r1["skipped"] == [True, False, False, False]
        assert_ranks_hold_the_replica(r0, r1, 3)
        assert [m.version for m in published(url, run)] == [1, 2, 3]
        assert follower.digest() == r0["digest"]


def test_transformers_trainer_in_a_2_rank_job_and_its_resume(tmp_path):
    """Trainer wraps the model in DDP itself and saves the optimizer's state_dict on rank 0 only (no collective may hide
    in state_dict); the restarted job resumes on every rank from checkpoint-4 and continues the run at v4."""
    url, run = f"file://{tmp_path}/log", "trainer"
    follower = Follow(url, run, tmp_path, 6)
    with reaped(follower.proc):
        rc, out, (r0, r1) = torchrun("trainer", url, run, tmp_path, 4)
        assert rc == 0, out[-4000:]
        assert r0["global_step"] == r1["global_step"] == 4
        assert_ranks_hold_the_replica(r0, r1, 4)
        rc, out, (r0, r1) = torchrun("trainer", url, run, tmp_path, 6)
        assert rc == 0, out[-4000:]
        assert r0["start_version"] == r1["start_version"] == 4 and r0["global_step"] == r1["global_step"] == 6
        assert_ranks_hold_the_replica(r0, r1, 6)
        assert [m.version for m in published(url, run)] == [1, 2, 3, 4, 5, 6]
        assert follower.digest() == r0["digest"]


def test_an_fsdp2_job_gathers_the_sharded_gradients_to_the_publishing_rank_and_writes_each_shard_back(tmp_path):
    """fully_shard: each rank holds half of every LoRA param (a DTensor shard). Every rank all-gathers the gradients,
    the publishing rank encodes them whole, and every rank writes its slice of the replica's params back: the whole
    params, gathered again, are the replica's on both ranks, and the site ends at the same digest."""
    url, run = f"file://{tmp_path}/log", "fsdp2"
    follower = Follow(url, run, tmp_path, 3)
    with reaped(follower.proc):
        rc, out, (r0, r1) = torchrun("fsdp2", url, run, tmp_path, 3)
        assert rc == 0, out[-4000:]
        assert r0["sharded"] and r1["sharded"]
        assert r0["local_shapes"] == r1["local_shapes"] and r0["local_shapes"][0][0] == 4  # LoRA rank 8, split in two
        assert_ranks_hold_the_replica(r0, r1, 3)
        assert [m.version for m in published(url, run)] == [1, 2, 3]
        assert follower.digest() == r0["digest"]


def test_accelerate_launch_runs_the_readme_plain_loop_unchanged(tmp_path):
    """`accelerate launch` (torchrun underneath; --multi_gpu is its multi-process switch, on CPU here) of the README's
    plain loop, word for word: nothing in it initializes torch.distributed, so HiLoOptimizer does, from the launcher's
    environment, and rank 0 publishes."""
    url, run = f"file://{tmp_path}/log", "launched"
    follower = Follow(url, run, tmp_path, 4)
    with reaped(follower.proc):
        rc, out, (r0, r1) = launch(ACCELERATE_2, SNIPPETS, ["plain loop", url, run, tmp_path, 4], tmp_path)
        assert rc == 0, out[-4000:]
        assert "hilo initialized it (gloo) so that this rank alone publishes" in out
        assert r0["publishes"] and not r1["publishes"]
        assert r0["version"] == r1["version"] == 4 and r0["digest"] == r1["digest"]
        assert r0["params_sha256"] == r1["params_sha256"] and r0["params_are_replica"] and r1["params_are_replica"]
        assert [m.version for m in published(url, run)] == [1, 2, 3, 4]
        assert follower.digest() == r0["digest"]


def test_accelerate_launch_runs_the_trl_grpo_trainer_snippet_unchanged(tmp_path):
    """TRL's GRPOTrainer under `accelerate launch` with 2 processes, the docs' snippet word for word: the trainer's
    Accelerator initializes torch.distributed and wraps the model in DDP; each rank generates and scores its own
    completions; rank 0 publishes one version per optimizer step and both ranks end at the replica."""
    url, run, steps = f"file://{tmp_path}/log", "grpo2", 2
    follower = Follow(url, run, tmp_path, steps)
    with reaped(follower.proc):
        rc, out, (r0, r1) = launch(ACCELERATE_2, SNIPPETS, ["TRL GRPOTrainer", url, run, tmp_path, steps], tmp_path)
        assert rc == 0, out[-4000:]
        assert r0["publishes"] and not r1["publishes"]
        assert r0["global_step"] == r1["global_step"] == steps
        assert r0["version"] == r1["version"] == steps and r0["digest"] == r1["digest"]
        assert r0["params_sha256"] == r1["params_sha256"] and r0["params_are_replica"] and r1["params_are_replica"]
        assert [m.version for m in published(url, run)] == list(range(1, steps + 1))
        assert follower.digest() == r0["digest"]


REFUSED = {  # a scenario of _dist_worker.py's `refusals` job: the line every rank must raise
    "codec": r"ConfigError: torch.distributed job: rank 1's ProducerConfig.codec is 'dense', the publishing rank 0's "
             r"is 'spar4'; every rank must open the run with the same config and LoRA layout \(nothing was published\)",
    "layout": r"ConfigError: torch.distributed job: rank 1's LoRA layout is \(.*LoRA rank 4, 28 blocks, .*\), the "
              r"publishing rank 0's is \(.*LoRA rank 8, 28 blocks, .*\); every rank must",
    "publish": r"ConfigError: rank 0 of 2: ProducerConfig.publish_rank = 2: this job's ranks are 0..1",
    "fsdp2_one": r"ConfigError: torch.distributed job: rank 1's LoRA sharding is FSDP2, the publishing rank 0's is "
                 r"none; every rank must",
    "publish_rank": r"ConfigError: torch.distributed job: rank 1's ProducerConfig.publish_rank is 1, the publishing "
                    r"rank 0's is 0; every rank must",
}


def test_ranks_that_disagree_are_refused_on_every_rank_before_anything_is_published(tmp_path):
    """Another codec, another LoRA layout, a publishing rank outside the job, FSDP2 on one rank only, and ranks that
    name different publishing ranks: each refused with the same one line on every rank, its log never opened. One
    job tries them in turn (each a fresh model and config; the process group outlives a refusal)."""
    rc, out, (r0, r1) = torchrun("refusals", f"file://{tmp_path}/log", "bad", tmp_path, 2)
    assert rc == 0, out[-4000:]
    assert list(r0["refused"]) == list(REFUSED), r0
    for scenario, line in REFUSED.items():
        got = r0["refused"][scenario]
        assert got == r1["refused"][scenario] and got and "\n" not in got, (scenario, got, r1["refused"][scenario])
        assert re.fullmatch(line + ".*", got), (scenario, got)
    assert not (tmp_path / "log").exists()  # no log was even opened


def test_a_step_the_publishing_rank_refuses_moves_no_rank_and_raises_its_line_on_every_rank(tmp_path):
    url, run = f"file://{tmp_path}/log", "nan"
    rc, out, (r0, r1) = torchrun("nan", url, run, tmp_path, 3)
    assert rc == 0, out[-4000:]
    assert r0["errors"] == r1["errors"] and len(r0["errors"]) == 1
    assert r0["errors"][0].startswith("TrainerError: run nan: the gradient of '") and "nothing was published" in r0[
        "errors"][0]
    assert r0["version_after_error"] == r1["version_after_error"] == 1
    assert_ranks_hold_the_replica(r0, r1, 2)
    assert [m.version for m in published(url, run)] == [1, 2]


@pytest.mark.parametrize("scenario", ["fenced", "fenced_pipelined"])
def test_a_fenced_publishing_rank_stops_every_rank_with_the_same_line(tmp_path, scenario):
    """Another trainer of the run (a lone process) opens it between two steps: the publishing rank's next publish is
    fenced, and every rank stops with its FencedError line; nothing more of this job's is on the log. Pipelined: the
    fenced version was adopted by every rank; the next step raises the fence on every rank."""
    url, run = f"file://{tmp_path}/log", "fenced"
    rc, out, (r0, r1) = torchrun(scenario, url, run, tmp_path, 3)
    assert rc != 0
    assert r0["stopped"] == r1["stopped"] and "\n" not in r0["stopped"], (r0["stopped"], r1["stopped"])
    assert r0["stopped"].startswith(f"FencedError: file://{tmp_path}/log: run fenced: this trainer"), r0["stopped"]
    assert [m.version for m in published(url, run)] == [1]


@pytest.mark.parametrize("killed", [0, 1], ids=["the publishing rank", "the other rank"])
def test_a_rank_killed_mid_step_stops_the_job_with_one_line_and_a_restart_resumes(tmp_path, killed):
    """SIGKILL mid-step: the publishing rank right after v2's transaction committed, before it told rank 1; or rank 1
    after its backward, while the publishing rank is in step(). The survivor stops on its own (no torchrun here to stop
    it), with one line, long before any timeout; v2 is on the log once, and the restarted job resumes there."""
    url, run = f"file://{tmp_path}/log", "killed"
    follower = Follow(url, run, tmp_path, 4)
    survivor = 1 - killed
    with reaped(follower.proc):
        crash = {"HILO_TEST_CRASH": "0:trainer.committed:2"} if killed == 0 else {}
        codes, outs, reps = ranks_by_hand("train" if killed == 0 else "die", url, run, tmp_path, 4, **crash)
        assert codes[killed] == -signal.SIGKILL and reps[killed] is None
        assert codes[survivor] != 0, outs[survivor][-3000:]
        line = reps[survivor]["stopped"]
        assert "\n" not in line
        if killed == 0:
            assert line.startswith("TrainerError: run killed: rank 1 of 2, step: the publishing rank 0 stopped or did "
                                   "not answer within rank_timeout_s = 60s"), line
        else:
            # v2's message (sent before its publish) or the outcome (v1 where that failed, else v2): whichever the dead
            # rank's socket refused first
            assert re.match(r"TrainerError: run killed: rank 0 of 2, step \(sending (v2's message before its "
                            r"apply|v[12] to the ranks)\): a rank stopped or did not answer within rank_timeout_s = "
                            r"60s", line), line
        on_log = [m.version for m in published(url, run)]
        assert on_log == [1, 2] if killed == 0 else on_log in ([1], [1, 2])  # rank 1 never applied v2
        rc, out, (r0, r1) = torchrun("train", url, run, tmp_path, 4 - on_log[-1])
        assert rc == 0, out[-4000:]
        assert r0["start_version"] == r1["start_version"] == on_log[-1]
        assert_ranks_hold_the_replica(r0, r1, 4)
        assert [m.version for m in published(url, run)] == [1, 2, 3, 4]
        assert follower.digest() == r0["digest"]


def test_a_multi_rank_launch_that_cannot_be_joined_is_refused_before_the_log_is_opened(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # a launcher's, without its rendezvous: each rank would fence the others
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError,
                       match=r"WORLD_SIZE=2 \(a multi-rank launch\) without RANK, MASTER_ADDR, MASTER_PORT, and "
                             r"torch.distributed is not initialized"):
        HiLoOptimizer(small_model(), ProducerConfig(run="r", log=f"file://{tmp_path}/log"))
    assert not (tmp_path / "log").exists()


def test_publish_rank_and_rank_timeout_are_checked():
    with pytest.raises(ConfigError, match=r"ProducerConfig.publish_rank = -1: must be >= 0"):
        ProducerConfig(run="r", publish_rank=-1)
    with pytest.raises(ConfigError, match=r"ProducerConfig.rank_timeout_s = 60: must exceed publish_deadline_s = 600"):
        ProducerConfig(run="r", rank_timeout_s=60)


# -- the step protocol in one process: two RankProducers joined by a wire instead of a process group ------------------

class Wire:
    """Stands in for Ranks: what the publishing rank shares is handed, in order, to the other rank's next share."""

    def __init__(self, rank, frames):
        self.rank, self.world, self.publish_rank, self.frames = rank, 2, 0, frames

    @property
    def publishes(self):
        return self.rank == 0

    def share(self, data, what):
        if self.publishes:
            self.frames.append(data)
            return data
        return self.frames.pop(0)


def joined_pair(tmp_path, **config):
    """(publishing RankProducer over a real HiLoProducer on a file log, the other rank's, the other rank's model)."""
    frames, cfg = [], producer_config(run="wire", log=f"file://{tmp_path}/log", **config)
    inner = HiLoProducer.open(small_model(), cfg)
    pub = RankProducer(Wire(0, frames), inner.model, cfg, inner.manifest, inner.weights, inner)
    other_model = small_model(seed=1)
    _, weights = lora_weights(other_model)
    start = PolicyReplica.from_checkpoint(decode_record(inner.replica.checkpoint().to_bytes(), "start"), "start")
    other = RankProducer(Wire(1, frames), other_model, cfg, inner.manifest, weights, None, start)
    other.write_back()
    return pub, other


def grads(producer, seed):
    gen = torch.Generator().manual_seed(seed)
    for p in producer.params:
        p.grad = torch.randn(p.shape, generator=gen) * 0.01


def assert_same(pub, other):
    assert (other.version, other.replica.digest) == (pub.version, pub.replica.digest)
    assert all(torch.equal(a.detach(), b.detach()) for a, b in zip(pub.params, other.params))
    assert all(torch.equal(a.detach(), r) for a, r in zip(other.params, other.replica.state.params))


def test_each_frame_moves_the_other_rank_as_the_publishing_rank_moved(tmp_path):
    pub, other = joined_pair(tmp_path)
    assert_same(pub, other)
    for seed in range(3):  # one message per step
        grads(pub, seed)
        assert pub.step(lr=1e-3) == other.step() == seed + 1
        assert_same(pub, other)
        assert other.last_step["bytes"] == pub.last_step["bytes"] > 0
    assert all(p.grad is None for p in other.params)  # zero_grad=True, as on the publishing rank

    def twice():  # the replica moves by more than one message (as a resync that adopts a version, then a step)
        for seed in (10, 11):
            grads(pub, seed)
            pub.inner.step(lr=1e-3)
    pub._together("two steps", twice)
    other._together("two steps", None)
    assert other.version == 5
    assert_same(pub, other)
    assert other.replica.recent[3] == pub.replica.recent[3]  # the versions it applied before are still remembered

    with pytest.raises(TrainerError, match="no LoRA parameter has a gradient") as raised:  # nothing to publish
        pub.step(lr=1e-3)
    with pytest.raises(TrainerError) as echoed:
        other.step()
    assert str(echoed.value) == str(raised.value) and other.version == pub.version == 5
    assert_same(pub, other)
    assert isinstance(pub, Trainer) and isinstance(other, Trainer) and isinstance(pub.inner, Trainer)  # one interface
    assert other.inner is None and pub.inner.metrics is not None  # the log, its metrics and the signer: one rank's
    pub.close()


def test_the_other_rank_gets_the_message_before_the_apply_and_adopts_it_only_on_commit(tmp_path):
    """Propose then commit across ranks: the step's first frame is the encoded message (no digest yet), sent before
    the publishing rank applies and publishes; a publish that fails after it moves no rank, and the next commits."""
    from hilo.schemas.errors import LogError
    pub, other = joined_pair(tmp_path, publish_deadline_s=1)
    frames, log = pub.ranks.frames, pub.inner.log
    log.append = lambda topic, records, partition=0: (_ for _ in ()).throw(LogError("simulated: broker refused"))
    grads(pub, 1)
    with pytest.raises(NotPublished, match="v1 was not published") as raised:
        pub.step(lr=1e-3)
    assert [next(iter(msgpack.unpackb(f, raw=False))) for f in frames] == ["proposed", "version"]
    with pytest.raises(NotPublished) as echoed:
        other.step()  # it computed v1 from the proposed frame, and drops it on the outcome
    assert str(echoed.value) == str(raised.value) and other.version == pub.version == 0
    assert_same(pub, other)
    del log.append
    assert pub.step(lr=1e-3) == other.step() == 1  # the same gradients, published this time
    assert_same(pub, other)
    pub.close()


def test_pipelined_ranks_adopt_each_version_at_once_and_the_log_holds_each_once(tmp_path):
    """ProducerConfig.pipeline across ranks: step() returns with v adopted on every rank (its publish under way on the
    publishing rank's thread); close() is a collective that settles the last one; the log holds every version once."""
    pub, other = joined_pair(tmp_path, pipeline=True)
    for seed in range(4):
        grads(pub, seed)
        assert pub.step(lr=1e-3) == other.step() == seed + 1
        assert_same(pub, other)  # v adopted on both while its publish may still run
    assert pub.inner.commits.pipeline.inflight is not None  # v4's publish was left in flight by step()
    pub.close()
    other.close()
    assert pub.inner.commits.pipeline.inflight is None
    assert [(m.version, m.digest) for m in published(f"file://{tmp_path}/log", "wire")] == [
        (v, pub.replica.recent[v]) for v in range(1, 5)]
    assert other.replica.recent == pub.replica.recent


def test_a_pipelined_publish_that_fails_while_the_next_step_computes_is_raised_by_every_rank_and_moves_none_on(
        tmp_path):
    """v2's publish fails on its thread while the ranks train on v2: the next step() raises it on every rank, each back
    at v1 bit for bit; nothing is published out of order, and the next step publishes v2 again (each version once)."""
    from hilo.schemas.errors import LogError
    pub, other = joined_pair(tmp_path, pipeline=True, publish_deadline_s=1)
    grads(pub, 0)
    assert pub.step(lr=1e-3) == other.step() == 1
    assert pub.flush() == other.flush() == 0  # v1 settled: its publish, still running on a busy machine, is not failed
    at_v1 = (pub.replica.digest, [p.detach().clone() for p in pub.params])
    log = pub.inner.log
    append = log.append
    log.append = lambda topic, records, partition=0: (_ for _ in ()).throw(LogError("simulated: broker refused"))
    grads(pub, 1)
    assert pub.step(lr=1e-3) == other.step() == 2  # adopted, its publish failing on the thread
    assert_same(pub, other)
    grads(pub, 2)
    with pytest.raises(NotPublished, match="v2 was not published") as raised:
        pub.step(lr=1e-3)  # settles v2 first: v3 is never proposed
    with pytest.raises(NotPublished) as echoed:
        other.step()
    assert str(echoed.value) == str(raised.value)
    assert other.version == pub.version == 1 and pub.replica.digest == at_v1[0]
    assert all(torch.equal(a.detach(), b) for a, b in zip(pub.params, at_v1[1]))
    assert_same(pub, other)
    log.append = append
    grads(pub, 1)
    assert pub.step(lr=1e-3) == other.step() == 2
    assert_same(pub, other)
    pub.close()
    other.close()
    assert [m.version for m in published(f"file://{tmp_path}/log", "wire")] == [1, 2]


def test_a_pipelined_failure_left_for_close_is_raised_by_every_rank(tmp_path):
    """The last version's publish fails after its step() returned: close() (a collective when pipelined) raises it on
    every rank, and every rank is back at the version before it."""
    from hilo.schemas.errors import LogError
    pub, other = joined_pair(tmp_path, pipeline=True, publish_deadline_s=1)
    grads(pub, 0)
    assert pub.step(lr=1e-3) == other.step() == 1
    assert pub.flush() == other.flush() == 0  # v1 settled: its publish, still running on a busy machine, is not failed
    pub.inner.log.append = lambda topic, records, partition=0: (_ for _ in ()).throw(LogError("simulated"))
    grads(pub, 1)
    assert pub.step(lr=1e-3) == other.step() == 2
    with pytest.raises(NotPublished, match="v2 was not published") as raised:
        pub.close()
    with pytest.raises(NotPublished) as echoed:
        other.close()
    assert str(echoed.value) == str(raised.value) and other.version == pub.version == 1
    assert_same(pub, other)


def test_another_ranks_error_is_raised_as_the_same_type_and_line():
    with pytest.raises(NotPublished, match="^v3 was not published$") as e:
        raise_as(["NotPublished", "v3 was not published", True])
    assert e.value.in_doubt
    with pytest.raises(ValueError, match="^bad$"):
        raise_as(["ValueError", "bad", False])
    with pytest.raises(TrainerError, match="^SomeLibraryError: it broke$"):
        raise_as(["SomeLibraryError", "it broke", False])
