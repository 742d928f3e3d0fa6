"""`hilo rl`: a GRPO run on the digit task, this process training and N generating sites answering through vLLM.
Options, defaults and help come from RLConfig (ops/rl.py)."""
from . import COMMANDS
from .args import config_from_args, config_options

FIELDS = ("vllm", "base", "log", "run", "state_dir", "sites", "prompt_partitions", "staleness", "steps",
          "batch_prompts", "samples",
          "lr", "codec", "budget", "seed", "reward", "trainer_threads", "stall_s")
AUDIT_FIELDS = ("share", "tolerance", "quarantine_after", "served_dtype", "noise_z_limit", "noise_headroom",
                "noise_min_tokens",
                "sampling_z_limit", "sampling_min_tokens", "release_after", "probe_share")


def run(a):
    """Run it; exit 0 only if every site ends at the trainer's digest."""
    from hilo.ops.rl import RLConfig, run_rl
    from hilo.producer.rollout_audit import AuditConfig
    return run_rl(config_from_args(RLConfig, a, audit=config_from_args(AuditConfig, a)), a.json)


def register(sub):
    """The rl parser."""
    from hilo.ops.rl import RLConfig
    p = sub.add_parser("rl", help=COMMANDS["rl"][1], description=__doc__)
    config_options(p, RLConfig, FIELDS, {"staleness": "--staleness"})
    from hilo.producer.rollout_audit import AuditConfig
    g = p.add_argument_group("audit", "the trainer recomputes a share of the rollouts under the version they claim and "
                             "quarantines a site that serves anything else (producer/rollout_audit.py)")
    config_options(g, AuditConfig, AUDIT_FIELDS,
                   {f: "--audit-" + f.replace("_", "-") for f in AUDIT_FIELDS if f != "share"}
                   | {"share": "--audit-share"})
    p.add_argument("--json", action="store_true", help="the per-step rows and the summary as one JSON object on stdout")
    p.set_defaults(fn=run)
