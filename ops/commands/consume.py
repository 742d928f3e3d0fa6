"""`hilo consume`: follow a run at a rollout site. Options, defaults and help come from SiteConfig."""
from . import COMMANDS
from .args import common, config_from_args, config_options

FIELDS = ("snapshot_every", "export_adapters", "export_dtype", "keep_adapters", "on_version", "vllm", "trust", "lora_name",
          "from_offset", "from_version", "until_version", "idle_exit_s", "wait_checkpoint_s", "history", "on_bad_record")
FLAGS = {"export_adapters": "--no-export", "idle_exit_s": "--idle-exit", "wait_checkpoint_s": "--wait-checkpoint"}


def run(a):
    """Open the site and follow until a signal, --until-version or --idle-exit."""
    from hilo.consumer.site import Site, SiteConfig
    site = Site.open(config_from_args(SiteConfig, a))
    site.install_signal_handlers()
    v = site.run(progress=False if a.no_progress else None)
    print(f"{a.site}: v{v} digest {site.follower.replica.digest.hex()}")
    return 0


def register(sub):
    """The consume parser."""
    from hilo.consumer.adapter_export import DTYPES
    from hilo.consumer.site import SiteConfig
    from hilo.replay.bad_records import POLICIES
    p = sub.add_parser("consume", help=COMMANDS["consume"][1])
    common(p)
    p.add_argument("--site", required=True, help="this site's name (its consumer group is hilo.RUN.SITE)")
    p.add_argument("--state-dir", required=True, help="snapshot + exported adapters live here")
    config_options(p, SiteConfig, FIELDS, FLAGS, choices={"export_dtype": sorted(DTYPES), "on_bad_record": list(POLICIES)})
    p.add_argument("--no-progress", action="store_true", help="no progress bar while catching up")
    p.set_defaults(fn=run)
