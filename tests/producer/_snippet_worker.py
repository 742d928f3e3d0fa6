"""One rank of a launcher's job running a README snippet unchanged: the `# README: NAME` block of
tests/producer/test_training_loops.py (tests/test_readme_snippets.py reads it), with the names it uses set as that
test sets them. Nothing in the snippets knows about ranks: HiLoOptimizer initializes torch.distributed from the
launcher's environment (the plain loop), or finds it initialized by the framework (GRPOTrainer's Accelerator), and
publishes through rank 0.

    accelerate launch --multi_gpu --num_processes 2 tests/producer/_snippet_worker.py SNIPPET URL RUN OUT STEPS

SNIPPET: "plain loop" or "TRL GRPOTrainer". Each rank writes OUT/rank{R}.json as _dist_worker.py does.
"""
import hashlib
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: `tests` is a package

import torch  # noqa: E402

from hilo.ops.tiny_trainer import batch, build_base, build_tokenizer  # noqa: E402
from hilo.producer.config import ProducerConfig  # noqa: E402
from hilo.producer.optimizer import HiLoOptimizer  # noqa: E402
from hilo.replica.codecs import Budget  # noqa: E402
from tests.conftest import small_model  # noqa: E402
from tests.test_readme_snippets import snippets  # noqa: E402

snippet, url, run, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4]), int(sys.argv[5])
rank = int(os.environ["RANK"])
names = {"HiLoOptimizer": HiLoOptimizer, "ProducerConfig": ProducerConfig, "torch": torch, "url": url, "run": run,
         "steps": steps}
if snippet == "plain loop":
    names |= {"batch": batch, "model": small_model(), "gen": torch.Generator().manual_seed(0), "norms": []}
elif snippet == "TRL GRPOTrainer":
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from tests.producer.test_training_loops import addition_prompts, digits_right
    names |= {"GRPOConfig": GRPOConfig, "GRPOTrainer": GRPOTrainer, "LoraConfig": LoraConfig, "Budget": Budget,
              "dataset": addition_prompts(), "digits_right": digits_right, "build_base": build_base,
              "build_tokenizer": build_tokenizer, "tmp_path": out}
else:
    sys.exit(f"_snippet_worker.py: no snippet {snippet!r}")
exec(snippets()[snippet], names)  # noqa: S102  (the README's code, word for word)
opt = names["opt"]
p = opt.producer
flat = b"".join(t.detach().float().contiguous().numpy().tobytes() for t in p.params)
(out / f"rank{rank}.json").write_text(json.dumps({
    "rank": rank, "version": opt.version, "digest": p.replica.digest.hex(),
    "params_sha256": hashlib.sha256(flat).hexdigest(),
    "params_are_replica": all(torch.equal(a.detach().float(), b) for a, b in zip(p.params, p.replica.state.params)),
    "publishes": p.publishes, "global_step": names["trainer"].state.global_step if "trainer" in names else None}))
p.close()
# the ranks tear down together: rank 1 aborted in its teardown once (C++ terminate) while rank 0 left
torch.distributed.barrier()
torch.distributed.destroy_process_group()
# Everything this rank owes is written (its JSON, the producer closed), so it leaves without the interpreter's teardown:
# there, under GRPOTrainer, a C++ thread some library left joinable aborted the process now and then ("terminate called
# without an active exception", SIGABRT), after all the work was done and checked.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
