"""`hilo doctor`: one line per check (OK / WARN / FAIL and what to do) of what is given; exit 1 if any FAILs.
Options, defaults and help come from DoctorConfig; the checks are the registry in hilo/ops/doctor/__init__.py."""
import json

from . import COMMANDS
from .args import config_from_args, config_options, names, run_id

FIELDS = ("log", "run", "kafka_config", "role", "vllm", "base", "state_dir", "min_free_gb", "connect_timeout_s")


def run(a):
    """Run the checks, print each line as it comes (or a JSON list at the end); 1 if any FAILed."""
    from hilo.ops.doctor import DoctorConfig, Status, run_checks
    results = []
    for r in run_checks(config_from_args(DoctorConfig, a), skip=a.skip or ()):
        results.append(r)
        if not a.json:
            print(r.line(), flush=True)
    if a.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    return 1 if any(r.status is Status.FAIL for r in results) else 0


def register(sub):
    """The doctor parser."""
    from hilo.ops.doctor import NAMES
    from hilo.ops.doctor.base import ROLES, DoctorConfig
    p = sub.add_parser("doctor", help=COMMANDS["doctor"][1],
                       description="Check what is given: the Kafka client file, the broker, a run's topics and this "
                                   "principal's ACLs, a vLLM server, and always this machine (kernels, CPU, free "
                                   "space). One line per check: OK, WARN (works, slower or less safe; or cannot tell), "
                                   "FAIL (would stop a trainer or site), SKIP (a check it builds on failed). Exit 0 "
                                   "when nothing FAILs.")
    config_options(p, DoctorConfig, FIELDS, choices={"role": ROLES}, types={"run": run_id})
    p.add_argument("--skip", type=names(NAMES), metavar="CHECKS",
                   help=f"checks not to run, a comma list of {', '.join(NAMES)}")
    p.add_argument("--json", action="store_true", help="print a JSON list of {check, status, found, fix}")
    p.set_defaults(fn=run)
