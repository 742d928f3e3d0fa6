"""A site that lies: `hilo consume` with one lie of lies.py installed (for the audit's tests and benches).

    python -m hilo.ops.faults.lying_site LIE ARGS...   # ARGS: the usual `hilo consume` arguments

Installs the lie through the site's seams, then runs the normal `hilo consume` entry; an unknown LIE is one line
naming it and the choices (exit 2).
"""
import sys

from hilo.ops import cli
from hilo.schemas.errors import ConfigError

from .lies import LIES, install


def main(argv=None) -> int:
    """Install the lie argv[0] names, then `hilo consume argv[1:]`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m hilo.ops.faults.lying_site {{{','.join(LIES)}}} HILO_CONSUME_ARGS...", file=sys.stderr)
        return 0 if argv else 2
    try:
        install(argv[0])
    except ConfigError as e:
        print(f"lying_site: error: {e}", file=sys.stderr)
        return 2
    return cli.main(["consume", *argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
