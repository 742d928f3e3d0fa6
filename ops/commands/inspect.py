"""`hilo inspect --version V`: one update's header fields and per-block rank/k and bytes; `--offset N`: one record by
offset, its headers and the verdict a site gives it (why a site skipped it: the same reason and error)."""
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
    if a.offset is not None:
        return show_record(log, a)
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


def show_record(log, a):
    """Print one record's headers and the verdict a site gives it."""
    from hilo.ops.inspect_record import inspect_offset
    from hilo.schemas.signing import Verifier
    d = inspect_offset(log, a.run, a.offset, Verifier.load(a.trust) if a.trust else None)
    if a.json:
        print(json.dumps(d, indent=2))
        return 0
    print(f"{d['topic']} offset {d['offset']}: {d['bytes']} bytes")
    for k, v in sorted(d["headers"].items()):
        print(f"  {k}: {v}")
    print(f"verdict: {d['verdict']}" + (f" ({d['reason']})" if d["reason"] else "") + f": {d['detail']}")
    for k, v in (d.get("message") or {}).items():
        print(f"  {k}: {v}")
    return 0


def register(sub):
    """The inspect parser."""
    p = sub.add_parser("inspect", help=COMMANDS["inspect"][1])
    common(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--version", type=at_least(1), help="policy version to show")
    which.add_argument("--offset", type=at_least(0),
                       help="show the RUN.updates record at this offset and whether a reader "
                       "skips it, and why (the offset a site's skip warning names)")
    p.add_argument("--trust", metavar="PUB",
                   help="with --offset: check the signature against this public key, as a signed "
                   "site does (following the run's key rotations it verifies)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(fn=run)
