"""`hilo inspect --version V`: one update's header fields and per-block rank/k and bytes."""
import json

from . import COMMANDS
from .args import at_least, common, existing_run, open_from


def run(a):
    """Print one version's description."""
    from hilo.log import checkpoints_topic
    from hilo.log.tail import last_message
    from hilo.ops.inspect_version import describe
    from hilo.schemas.records import decode_record
    log = open_from(a)
    existing_run(log, a.run)
    ck = last_message(log, checkpoints_topic(a.run), a.run)
    manifest = decode_record(ck.data, "checkpoint").manifest if ck else None
    d = describe(log, a.run, a.version, manifest)
    if a.json:
        print(json.dumps(d, indent=2))
        return 0
    for k, v in d.items():
        if k != "blocks":
            print(f"{k:>14}: {v}")
    print(f"\n{'i':>5}  {'k/n':>6}  {'bytes':>9}  block")
    for b in d["blocks"]:
        print(f"{b['i']:>5}  {b['k']!s:>6}  {b['bytes']:>9}  {b['block'] or ''}")
    return 0


def register(sub):
    """The inspect parser."""
    p = sub.add_parser("inspect", help=COMMANDS["inspect"][1])
    common(p)
    p.add_argument("--version", type=at_least(1), required=True, help="policy version to show")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(fn=run)
