"""One rank of a launcher's job running the README's plain loop unchanged: the `# README: plain loop` block of
tests/producer/test_training_loops.py (tests/test_readme_snippets.py reads it), with the names it uses set as that
test sets them. Nothing in it knows about ranks: HiLoOptimizer initializes torch.distributed from the launcher's
environment and publishes through rank 0.

    accelerate launch --cpu --num_processes 2 tests/producer/_snippet_worker.py URL RUN OUT STEPS

Each rank writes OUT/rank{R}.json as _dist_worker.py does.
"""
import hashlib
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: `tests` is a package

import torch  # noqa: E402

from hilo.ops.tiny_trainer import batch  # noqa: E402
from hilo.producer.config import ProducerConfig  # noqa: E402
from hilo.producer.optimizer import HiLoOptimizer  # noqa: E402
from tests.conftest import small_model  # noqa: E402
from tests.test_readme_snippets import snippets  # noqa: E402

url, run, out, steps = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), int(sys.argv[4])
rank = int(os.environ["RANK"])
names = {"HiLoOptimizer": HiLoOptimizer, "ProducerConfig": ProducerConfig, "batch": batch, "torch": torch, "url": url,
         "run": run, "steps": steps, "model": small_model(), "gen": torch.Generator().manual_seed(0), "norms": []}
exec(snippets()["plain loop"], names)  # noqa: S102  (the README's code, word for word)
opt = names["opt"]
p = opt.producer
flat = b"".join(t.detach().float().contiguous().numpy().tobytes() for t in p.params)
(out / f"rank{rank}.json").write_text(json.dumps({
    "rank": rank, "version": opt.version, "digest": p.replica.digest.hex(), "params_sha256": hashlib.sha256(flat).hexdigest(),
    "params_are_replica": all(torch.equal(a.detach().float(), b) for a, b in zip(p.params, p.replica.state.params)),
    "publishes": p.publishes}))
p.close()
torch.distributed.destroy_process_group()
