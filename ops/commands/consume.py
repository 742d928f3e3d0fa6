"""`hilo consume`: follow a run at a rollout site. Options, defaults and help come from SiteConfig (and MetricsConfig).

With --metrics-port a site that stops on an error (a gap after a skip, a fork, a divergence) does not exit: it keeps
its last good version (and vLLM keeps serving it), /readyz answers 503 with the reason, and SIGTERM ends it (exit 1).
A supervisor that restarted it would only read the same record again; an alert on /readyz tells an operator why.
"""
import logging
import signal
import time

from . import COMMANDS
from .args import common, config_from_args, config_options, field_help, metrics_options, metrics_server

logger = logging.getLogger(__name__)

FIELDS = ("snapshot_every", "snapshot_every_s", "export_adapters", "export_dtype", "keep_adapters", "on_version",
          "vllm", "trust",
          "lora_name", "self_check", "self_check_base", "self_check_tolerance", "from_offset", "from_version",
          "until_version",
          "idle_exit_s", "wait_checkpoint_s", "history", "on_bad_record", "apply", "prefetch")
FLAGS = {"export_adapters": "--no-export", "idle_exit_s": "--idle-exit", "wait_checkpoint_s": "--wait-checkpoint"}


def run(a):
    """Open the site and follow until a signal, --until-version or --idle-exit."""
    from hilo.consumer.config import SiteConfig
    from hilo.consumer.site import Site
    from hilo.schemas.errors import ConfigError, HiloError
    from hilo.schemas.metrics import Metrics
    cfg = config_from_args(SiteConfig, a)
    if a.generate and (cfg.vllm is None or a.reward is None):  # said before anything is opened or bootstrapped
        raise ConfigError("--generate needs --vllm URL (the server that answers) and --reward MODULE:FUNCTION (the "
                          "digit task's: hilo.ops.digit_task:reward)")
    metrics = Metrics("site", run=cfg.run, site=cfg.site)
    server = metrics_server(a, metrics.registry)  # bound before anything is applied: a port in use fails here
    site = Site.open(cfg, metrics=metrics)
    if a.generate:
        from hilo.consumer.generator import GenerateConfig
        site.generate(config_from_args(GenerateConfig, a))
    def stop(signum, _frame):  # between versions: the loop checks site.stopping after each
        logger.info("site %s: signal %d, stopping after the current version", cfg.site, signum)
        site.stopping = True
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    if server:
        server.ready = lambda: site.readiness(a.ready_max_lag)
    try:
        v = site.run(progress=False if a.no_progress else None)
    except HiloError as e:
        if server is None:
            raise
        logger.error("site %s: stopped at v%d: %s; serving /readyz 503 until SIGTERM", cfg.site,
                     site.follower.replica.version, e)
        while not site.stopping:
            time.sleep(0.2)
        raise
    print(f"{a.site}: v{v} digest {site.follower.replica.digest.hex()}")
    return 0


def register(sub):
    """The consume parser."""
    from hilo.consumer.adapter_export import DTYPES
    from hilo.consumer.config import SiteConfig
    from hilo.replay.bad_records import OnBadRecord
    from hilo.replica.kernels import MODES as APPLY_MODES
    p = sub.add_parser("consume", help=COMMANDS["consume"][1])
    common(p)
    docs = field_help(SiteConfig)
    p.add_argument("--site", required=True, help=docs["site"])
    p.add_argument("--state-dir", required=True, help=docs["state_dir"])
    config_options(p, SiteConfig, FIELDS, FLAGS,
                   choices={"export_dtype": sorted(DTYPES), "on_bad_record": [o.value for o in OnBadRecord],
                                                             "apply": list(APPLY_MODES)})
    from hilo.consumer.generator import GenerateConfig
    g = p.add_argument_group("generating (the return path)",
                             "answer the run's prompts with the policy vLLM serves, between "
                             "versions; rollouts and the prompts they answer settle together (exactly once)")
    g.add_argument("--generate", action="store_true",
                   help="also take prompts from RUN.prompts and return rollouts (needs --vllm)")
    config_options(g, GenerateConfig, ("reward", "batch_prompts", "lease_s", "signing_key"),
                   {"batch_prompts": "--generate-batch", "signing_key": "--site-key"})
    metrics_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar while catching up")
    p.set_defaults(fn=run)
