"""`hilo acls grant|show`: a run's Kafka ACLs."""
import json

from . import COMMANDS
from .args import command_group, common, open_from


def grant(a):
    """Grant the trainer and site principals what they need."""
    from hilo.ops.acls import grant as do_grant
    n = do_grant(open_from(a), a.run, {"trainer": a.trainer, "site": a.site})
    print(
        f"{n} ACLs for run {a.run}: {a.trainer} moves the policy, {a.site} reads it and commits hilo.{a.run}.* groups")
    return 0


def show(a):
    """Print the ACLs on the run's resources."""
    from hilo.ops.acls import show as do_show
    rows = do_show(open_from(a), a.run)
    if a.json:
        print(json.dumps(rows, indent=2))
    for r in [] if a.json else rows:
        print(f"{r['principal']:<20} {r['operation']:<17} {r['resource']:<17} {r['name']} ({r['pattern']})")
    return 0


def register(sub):
    """The acls command group."""
    asub = command_group(sub, "acls", COMMANDS["acls"][1])
    c = asub.add_parser("grant",
                        help="the trainer may write the run's topics; sites may read them and commit hilo.RUN.* groups")
    common(c)
    c.add_argument("--trainer", required=True, metavar="USER", help="the trainer's principal (User:NAME or NAME)")
    c.add_argument("--site", required=True, metavar="USER", help="the sites' principal (User:NAME or NAME)")
    c.set_defaults(fn=grant)
    c = asub.add_parser("show", help="the ACLs the cluster holds on the run's topics, groups and transactional id")
    common(c)
    c.add_argument("--json", action="store_true", help="print a JSON list")
    c.set_defaults(fn=show)
