"""`hilo rl`: a GRPO run on the digit task, this process training and N generating sites answering through vLLM.
Options, defaults and help come from RLConfig (ops/rl.py)."""
from . import COMMANDS
from .args import config_from_args, config_options

FIELDS = ("vllm", "base", "log", "run", "state_dir", "sites", "prompt_partitions", "staleness", "steps", "batch_prompts", "samples",
          "lr", "codec", "budget", "seed", "reward", "trainer_threads")


def run(a):
    """Run it; exit 0 only if every site ends at the trainer's digest."""
    from hilo.ops.rl import RLConfig, run_rl
    return run_rl(config_from_args(RLConfig, a), a.json)


def register(sub):
    """The rl parser."""
    from hilo.ops.rl import RLConfig
    p = sub.add_parser("rl", help=COMMANDS["rl"][1], description=__doc__)
    config_options(p, RLConfig, FIELDS, {"staleness": "--staleness"})
    p.add_argument("--json", action="store_true", help="the per-step rows and the summary as one JSON object on stdout")
    p.set_defaults(fn=run)
