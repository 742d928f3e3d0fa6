"""`hilo docs`: write the generated docs pages (ops/docs_pages.py); `--check` writes nothing and fails on a stale
page."""
import pathlib
import sys

from . import COMMANDS


def run(a):
    """Write every page that differs from its generator, or with --check name each one and exit 1."""
    from hilo.ops import docs_pages
    root = pathlib.Path(a.root) if a.root else docs_pages.ROOT
    if a.check:
        stale = docs_pages.stale(root)
        if stale:
            print(f"hilo docs: {', '.join(stale)} differ{'s' if len(stale) == 1 else ''} from what `hilo docs` writes "
                  f"(a table edited by hand, or results not regenerated): run `hilo docs`", file=sys.stderr)
            return 1
        print(f"hilo docs: {len(docs_pages.PAGES)} pages up to date")
        return 0
    written = docs_pages.write(root)
    for page in written:
        print(f"wrote {page}")
    print(f"hilo docs: {len(written)} of {len(docs_pages.PAGES)} pages rewritten")
    return 0


def register(sub):
    """The docs parser."""
    p = sub.add_parser("docs", help=COMMANDS["docs"][1],
                       description="Render the generated parts of the docs (benchmark tables from docs/results/, the "
                                   "metrics and ACL tables, the README's headline figures) and write the pages that "
                                   "changed.")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming each page that differs from what would be written")
    p.add_argument("--root", metavar="DIR", help="the checkout whose docs to render (default: the one hilo runs from)")
    p.set_defaults(fn=run)
