"""`hilo topics create|list|describe`: a run's topics."""
from hilo.log import checkpoints_topic, prompts_topic, rollouts_topic, updates_topic

from . import COMMANDS
from .args import at_least, command_group, common, log_args, open_from, report


def create(a):
    """Create the run's topics, or check existing ones."""
    log = open_from(a)
    created = log.create_topics(a.run, a.retention_ms)
    for t in (updates_topic(a.run), checkpoints_topic(a.run)):
        print(f"{t}: {'created' if t in created else 'exists, checked (1 partition, cleanup.policy=delete)'}")
    if a.prompt_partitions:
        created = log.create_rollout_topics(a.run, a.prompt_partitions, a.retention_ms)
        for t, n in ((prompts_topic(a.run), a.prompt_partitions), (rollouts_topic(a.run), 1)):
            shape = ("one queue: the embedded log shares prompts by leases" if n > 1
                     else "one queue") if a.log.startswith("file://") else \
                f"{n} partition{'s' if n > 1 else ''}, cleanup.policy=delete"
            print(f"{t}: {'created' if t in created else 'exists, checked'} ({shape})")
    return 0


def list_runs(a):
    """Print the runs on a log."""
    for run in open_from(a).runs():
        print(run)
    return 0


def register(sub):
    """The topics command group."""
    from hilo.ops.describe import describe_run, format_rows
    tsub = command_group(sub, "topics", COMMANDS["topics"][1])
    c = tsub.add_parser("create",
                        help="create RUN.updates (1 partition, delete policy) and RUN.checkpoints; check existing ones")
    common(c)
    c.add_argument("--retention-ms", type=int, default=-1,
                   help="retention of the run's topics; -1 keeps forever (default)")
    c.add_argument("--prompt-partitions", type=at_least(1), metavar="P",
                   help="also create the return path: RUN.prompts with "
                   "P partitions (prompts spread over at most P generating sites) and RUN.rollouts (default: not "
                   "created)")
    c.set_defaults(fn=create)
    c = tsub.add_parser("list", help="the runs on a log (topics RUN.updates)")
    log_args(c)
    c.set_defaults(fn=list_runs)
    report(tsub, "describe",
           "a run's topics: retained offsets, records, messages and versions (reads them once), retention, "
           "whether a new site can join and until when", describe_run, format_rows)
