"""One rank of the 2-rank jobs of tests/producer/test_distributed.py, started by torchrun (or directly, with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, where the test must see what a rank does on its own).

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/producer/_dist_worker.py SCENARIO URL RUN OUT STEPS

Every rank runs the same loop: the tiny model (other LoRA weights on every rank but 0, so only the sync can make them
equal), wrapped in DistributedDataParallel, a HiLoOptimizer, a scheduler and clipping, each rank on its own batches.
It writes OUT/rank{R}.json: its version, its replica's digest, a digest of its model's LoRA params and whether they
equal the replica's bit for bit, its state_dict's "hilo" entry (less the encoder, which the publishing rank alone
keeps), the error lines it caught, and the one it stopped with. Scenarios:
  train       STEPS steps; `OUT/opt.pt` (rank 0's state_dict) is saved after them, and loaded first when it exists
  codec       rank 1 asks for another codec: refused on both ranks before anything is published
  layout      rank 1's adapter has another LoRA rank: refused likewise (the optimizer before DDP, which refuses it too)
  publish     publish_rank = 2 in a 2-rank job: refused likewise
  nan         the publishing rank's gradient has a NaN at the second step: both ranks raise its line, neither moves
HILO_TEST_CRASH=RANK:POINT:N arms HILO_CRASH_AT=POINT:N (log/crashpoints.py) on that rank only.
"""
import datetime
import hashlib
import json
import os
import pathlib
import sys

scenario, url, run, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4]), int(sys.argv[5])
rank = int(os.environ["RANK"])
crash = os.environ.pop("HILO_TEST_CRASH", "")
if crash and int(crash.split(":", 1)[0]) == rank:
    os.environ["HILO_CRASH_AT"] = crash.split(":", 1)[1]  # read when hilo.log.crashpoints is imported

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from hilo.ops.tiny_trainer import batch, build_model  # noqa: E402
from hilo.producer.config import ProducerConfig  # noqa: E402
from hilo.producer.optimizer import HiLoOptimizer  # noqa: E402
from hilo.replica.codecs import Budget  # noqa: E402

report = {"rank": rank, "errors": []}


def write():
    (out / f"rank{rank}.json").write_text(json.dumps(report))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    other = rank != 0
    model = build_model(seed=0, rank=4 if scenario == "layout" and other else 8, hidden=64, layers=2)
    if other:
        with torch.no_grad():  # other weights than rank 0's: only the start state the publishing rank sends equals them
            for n, p in model.named_parameters():
                if "lora_" in n:
                    p.add_(0.5)
    cfg = {"codec": "dense"} if scenario == "codec" and other else {}
    cfg |= {"publish_rank": 2} if scenario == "publish" else {}
    config = ProducerConfig(run=run, log=url, budget=Budget(0.25), checkpoint_every=3, publish_deadline_s=20,
                            rank_timeout_s=60, **cfg)
    if scenario == "layout":  # DDP itself refuses params that differ in shape: the optimizer comes first here
        opt = HiLoOptimizer(model, config, lr=3e-3)
        ddp = DistributedDataParallel(model)
    else:
        ddp = DistributedDataParallel(model)
        opt = HiLoOptimizer(ddp, config, lr=3e-3)
    saved = out / "opt.pt"
    if saved.exists():  # a restarted job resumes from what rank 0 saved (as a framework's checkpoint does)
        opt.load_state_dict(torch.load(saved, weights_only=True))
    report["start_version"] = opt.version
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
    gen = torch.Generator().manual_seed(1000 * rank + opt.version)
    for step in range(steps):
        ids, labels = batch(gen, 8)
        ddp(input_ids=ids, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm=0.5)
        if scenario == "nan" and step == 1 and rank == 0:
            opt.producer.params[3].grad[0, 0] = float("nan")
        try:
            opt.step()
        except Exception as e:  # noqa: BLE001  (the test compares every rank's line)
            if scenario != "nan":
                raise
            report["errors"].append(f"{type(e).__name__}: {e}")
            report["version_after_error"] = opt.version
        sched.step()
        opt.zero_grad()
    p = opt.producer
    flat = b"".join(t.detach().float().contiguous().numpy().tobytes() for t in p.params)
    report.update(version=opt.version, digest=p.replica.digest.hex(), params_sha256=hashlib.sha256(flat).hexdigest(),
                  params_are_replica=all(torch.equal(a.detach().float(), b) for a, b in zip(p.params, p.replica.state.params)))
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
        write()
        raise
    write()
