"""One rank of the 2-rank jobs of tests/producer/test_distributed.py, started by torchrun (or directly, with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, where the test must see what a rank does on its own).

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/producer/_dist_worker.py \
        SCENARIO URL RUN OUT STEPS

Every rank runs the same loop: the tiny model (other LoRA weights on every rank but 0, so only the sync can make them
equal), wrapped in DistributedDataParallel, a HiLoOptimizer, a scheduler and clipping, each rank on its own batches.
It writes OUT/rank{R}.json: its version, its replica's digest, a digest of its model's LoRA params and whether they
equal the replica's bit for bit, its state_dict's "hilo" entry (less the encoder, which the publishing rank alone
keeps), the error lines it caught, and the one it stopped with. Scenarios:
  train       STEPS steps; `OUT/opt.pt` (rank 0's state_dict) is saved after them, and loaded first when it exists
  codec       rank 1 asks for another codec: refused on both ranks before anything is published
  layout      rank 1's adapter has another LoRA rank: refused likewise (the optimizer before DDP, which refuses it too)
  publish     publish_rank = 2 in a 2-rank job: refused likewise
  publish_rank  rank 1 names itself the publishing rank: refused likewise (the same line on both ranks)
  fsdp2       the model sharded by FSDP2's fully_shard (each rank holds half of every LoRA param): STEPS steps
  fsdp2_one   only rank 1 shards its model: refused on both ranks before anything is published
  refusals    codec, layout, publish, fsdp2_one and publish_rank in turn in one job, each on URL/SCENARIO: the
              line each raised on this rank, in report["refused"]
  fenced      before the second step, rank 0 starts another trainer of the run (a process of its own) that fences
              this job's publishing rank: every rank stops with the same FencedError line
  outage      before the second step, rank 0 stops the job's Kafka broker (ops/kafka/stop.sh, its HILO_KAFKA_PORT and
              HILO_KAFKA_DIR from the environment): the publish fails and every rank stops with the same NotPublished
  die         rank 1 SIGKILLs itself at the second step, after its backward (the publishing rank is then in step())
  nan         the publishing rank's gradient has a NaN at the second step: both ranks raise its line, neither moves
  trainer     transformers Trainer to global step STEPS (a restarted job resumes from its newest save)
  accelerate  Accelerate's loop (prepare, accumulation of 2, clipping) on a sharded DataLoader of 16 * STEPS rows,
              whose grad scaler skips the first step (a first scale of 2^127 overflows): no rank calls step() then
SCENARIO_pipelined (train, fenced, outage, ...): the same with ProducerConfig.pipeline (every rank adopts a version
while its publish runs; the next step settles it).
HILO_TEST_CRASH=RANK:POINT:N arms HILO_CRASH_AT=POINT:N (schemas/crash_points.py) on that rank only.
"""
import datetime
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

scenario, url, run, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4]), int(sys.argv[5])
kind = scenario.removesuffix("_pipelined")  # SCENARIO_pipelined: SCENARIO with ProducerConfig.pipeline
rank = int(os.environ["RANK"])
crash = os.environ.pop("HILO_TEST_CRASH", "")
if crash and int(crash.split(":", 1)[0]) == rank:
    os.environ["HILO_CRASH_AT"] = crash.split(":", 1)[1]  # read when hilo.schemas.crash_points is imported

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from hilo.ops.tiny_trainer import batch, build_model  # noqa: E402
from hilo.producer.config import ProducerConfig  # noqa: E402
from hilo.producer.optimizer import HiLoOptimizer  # noqa: E402
from hilo.replica.codecs import Budget  # noqa: E402

report = {"rank": rank, "errors": []}
REFUSALS = ("codec", "layout", "publish", "fsdp2_one", "publish_rank")  # ranks that disagree: refused at opening
pids = []  # every rank's pid, once the job is joined (wait_for_the_others)


def write():
    (out / f"rank{rank}.json").write_text(json.dumps(report))


def _alive(pid: int) -> bool:
    try:  # a SIGKILLed rank started by the test stays a zombie until the test reaps it
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def wait_for_the_others(pids: list, within_s: float = 60.0) -> None:
    """Before a failing rank exits, each other rank's report is written (or that rank is gone): torchrun stops the
    survivors the moment one rank exits, and a rank still unwinding its error would leave no report."""
    deadline = time.monotonic() + within_s
    for r, pid in enumerate(pids):
        while r != rank and not (out / f"rank{r}.json").exists() and _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


class AdditionData(torch.utils.data.Dataset):
    """The tiny trainer's task as a map-style dataset (the same rows on every rank; the sampler shards them)."""

    def __init__(self, n):
        self.ids, self.labels = batch(torch.Generator().manual_seed(0), n)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def accelerate_loop(model, config, steps):
    """tests/producer/test_training_loops.py's Accelerate loop, on every rank of the job."""
    from accelerate import Accelerator
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)  # MULTI_CPU: the job's gloo process group
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, backoff_factor=2.0 ** -120,
                                              growth_interval=1000)
    opt = HiLoOptimizer(model, config, lr=1e-3)
    data = torch.utils.data.DataLoader(AdditionData(16 * steps), batch_size=4)
    model_, opt_, data = accelerator.prepare(model, opt, data)
    report["skipped"] = []
    for item in data:
        with accelerator.accumulate(model_):
            accelerator.backward(model_(**item).loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model_.parameters(), 1.0)
            opt_.step()
            if accelerator.sync_gradients:
                report["skipped"].append(opt_.step_was_skipped)
            opt_.zero_grad()
    return opt


def trainer_loop(model, config, steps):
    """transformers Trainer under the job, to global step STEPS: it wraps the model in DDP itself, saves every 2 steps
    (the optimizer's state_dict on rank 0 only) and, in a restarted job, resumes on every rank from the newest save."""
    from transformers import Trainer, TrainingArguments
    opt = HiLoOptimizer(model, config, lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    args = TrainingArguments(output_dir=str(out / "trainer-out"), per_device_train_batch_size=4,
                             gradient_accumulation_steps=2,
                             max_steps=steps, max_grad_norm=0.5, use_cpu=True, report_to=[], disable_tqdm=True,
                             save_steps=2)
    trainer = Trainer(model=model, args=args, train_dataset=AdditionData(128), optimizers=(opt, sched))
    saves = sorted((out / "trainer-out").glob("checkpoint-*"), key=lambda d: int(d.name.split("-")[1]))
    report["start_version"] = opt.version
    trainer.train(resume_from_checkpoint=str(saves[-1]) if saves else None)
    report["global_step"] = trainer.state.global_step
    return opt


def another_trainer(config):
    """Open (and close) a lone trainer of `config`'s run in a process of its own: it fences this job's publishing
    rank."""
    code = ("import sys; from hilo.ops.tiny_trainer import build_model; from hilo.producer.config import "
            "ProducerConfig; from hilo.producer.producer import HiLoProducer; from hilo.replica.codecs import Budget; "
            "HiLoProducer.open(build_model(seed=0, rank=8, hidden=64, layers=2), ProducerConfig(run=sys.argv[2], "
            "log=sys.argv[1], budget=Budget(0.25), checkpoint_every=3)).close()")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    subprocess.run([sys.executable, "-c", code, config.log, config.run], env=env, check=True, timeout=240)


def plain_loop(opt, ddp, saved, steps):
    """A plain loop on the DDP model: each rank its own batches, a scheduler, clipping; opt.pt loaded first if saved."""
    if saved.exists():  # a restarted job resumes from what rank 0 saved (as a framework's checkpoint does)
        opt.load_state_dict(torch.load(saved, weights_only=True))
    report["start_version"] = opt.version
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
    gen = torch.Generator().manual_seed(1000 * rank + opt.version)
    report["grads_sha256"] = []
    for step in range(steps):
        ids, labels = batch(gen, 8)
        ddp(input_ids=ids, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm=0.5)
        grads = b"".join(p.grad.contiguous().numpy().tobytes() for p in opt.producer.params if p.grad is not None)
        report["grads_sha256"].append(hashlib.sha256(grads).hexdigest())  # DDP: the same on every rank
        if kind == "die" and step == 1 and rank == 1:  # mid-step for the publishing rank, which is in step()
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "fenced" and step == 1 and rank == 0:
            another_trainer(opt.producer.config)
        if kind == "outage" and step == 1 and rank == 0:
            subprocess.run([str(pathlib.Path(__file__).resolve().parents[2] / "ops/kafka/stop.sh")], check=True,
                           timeout=300)
        if kind in ("fenced", "outage") and step == 1:
            # Every rank waits here for rank 0's scaffolding (a trainer started, a broker stopped: tens of seconds on
            # a loaded machine), so rank_timeout_s times the step, not the scaffolding (CI saw rank 1 time out).
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=600))
        if kind == "nan" and step == 1 and rank == 0:
            opt.producer.params[3].grad[0, 0] = float("nan")
        try:
            opt.step()
        except Exception as e:  # noqa: BLE001  (the test compares every rank's line)
            if kind != "nan":
                raise
            report["errors"].append(f"{type(e).__name__}: {e}")
            report["version_after_error"] = opt.version
        sched.step()
        opt.zero_grad()


def fsdp_loop(opt, model, steps):
    """The FSDP2-sharded model: each rank its own batches; FSDP2 reduce-scatters the gradients into each rank's
    shard."""
    gen = torch.Generator().manual_seed(1000 * rank)
    report["local_shapes"] = [list(t.to_local().shape) for t in opt.producer.params[:2]]
    for _ in range(steps):
        ids, labels = batch(gen, 8)
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()


def model_and_config(scenario: str, url: str) -> tuple:
    """This rank's tiny model (other LoRA weights on every rank but 0) and its ProducerConfig for `scenario`."""
    other = rank != 0
    model = build_model(seed=0, rank=4 if scenario == "layout" and other else 8, hidden=64, layers=2)
    if other:
        with torch.no_grad():  # other weights than rank 0's: only the start state the publishing rank sends equals them
            for n, p in model.named_parameters():
                if "lora_" in n:
                    p.add_(0.5)
    cfg = {"codec": "dense"} if scenario == "codec" and other else {}
    cfg |= {"publish_rank": 2} if scenario == "publish" else {}
    cfg |= {"publish_rank": 1} if scenario == "publish_rank" and other else {}
    # The outage's broker is a fresh one of its own: its first transactions took over a minute under CI's load (a
    # rank timed out at v1, before any outage), so that scenario waits longer; the others assert on the 60 s.
    config = ProducerConfig(run=run, log=url, budget=Budget(0.25), checkpoint_every=3, publish_deadline_s=20,
                            rank_timeout_s=240 if kind == "outage" else 60,
                            pipeline=scenario.endswith("_pipelined"), **cfg)
    return model, config


def open_optimizer(scenario: str, model, config):
    """The HiLoOptimizer of a scenario that ends at opening (a refusal), as its job would open it."""
    if scenario == "fsdp2_one":  # the LoRA params become DTensor shards on rank 1 only
        from torch.distributed.fsdp import fully_shard
        if rank != 0:
            fully_shard(model)
        return HiLoOptimizer(model, config, lr=3e-3)
    if scenario == "layout":  # DDP itself refuses params that differ in shape: the optimizer comes first here
        opt = HiLoOptimizer(model, config, lr=3e-3)
        DistributedDataParallel(model)
        return opt
    return HiLoOptimizer(DistributedDataParallel(model), config, lr=3e-3)


def refusals():
    """Each refusal scenario in turn, in one job (one launch, not one each), each on a log of its own (URL/SCENARIO):
    report["refused"][SCENARIO] is the line this rank raised (None: nothing was refused)."""
    report["refused"] = {}
    for s in REFUSALS:
        try:
            open_optimizer(s, *model_and_config(s, f"{url}/{s}")).producer.close()
            report["refused"][s] = None
        except Exception as e:  # noqa: BLE001  (the test compares every rank's line)
            report["refused"][s] = f"{type(e).__name__}: {e}"


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    pids.extend([None] * dist.get_world_size())
    dist.all_gather_object(pids, os.getpid())
    if scenario == "refusals":
        refusals()
        dist.barrier()
        dist.destroy_process_group()
        return
    model, config = model_and_config(scenario, url)
    saved = out / "opt.pt"
    if scenario == "accelerate":
        opt = accelerate_loop(model, config, steps)
    elif scenario == "trainer":
        opt = trainer_loop(model, config, steps)
    elif scenario == "fsdp2":  # the LoRA params become DTensor shards
        from torch.distributed.fsdp import fully_shard
        fully_shard(model)
        opt = HiLoOptimizer(model, config, lr=3e-3)
        fsdp_loop(opt, model, steps)
    elif scenario in REFUSALS:
        opt = open_optimizer(scenario, model, config)
    else:
        ddp = DistributedDataParallel(model)
        opt = HiLoOptimizer(ddp, config, lr=3e-3)
        plain_loop(opt, ddp, saved, steps)
    p = opt.producer
    p.weights.gather(grads=False)  # FSDP2: the params whole (a collective: every rank is here)
    whole = p.weights.values()
    flat = b"".join(t.float().contiguous().numpy().tobytes() for t in whole)
    report.update(version=opt.version, digest=p.replica.digest.hex(), params_sha256=hashlib.sha256(flat).hexdigest(),
                  params_are_replica=all(torch.equal(a.float(), b) for a, b in zip(whole, p.replica.state.params)),
                  sharded=p.weights.sharded)
    sd = opt.state_dict()
    report["has_encoder"] = "encoder" in sd["hilo"]
    report["hilo"] = {k: v for k, v in sd["hilo"].items() if k != "encoder"}
    report["groups"] = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    if rank == 0:
        torch.save(sd, saved)
    p.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:
        report["stopped"] = f"{type(e).__name__}: {e}"
        report["in_doubt"] = getattr(e, "in_doubt", None)
        write()
        wait_for_the_others(pids)
        raise
    write()
