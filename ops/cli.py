"""The `hilo` command: run the producer, consumers, and operator tools. `hilo COMMAND --help` for each.

The commands are a table (hilo/ops/commands/__init__.py); only the one being run is imported, so the
operator commands (`hilo lag`, `hilo topics`) start without loading torch.
"""
import argparse
import faulthandler
import importlib
import logging
import signal
import sys

from hilo.schemas.errors import HiloError

from .commands import COMMANDS

EPILOG = """examples:
  hilo demo                                              # everything on one machine, no broker
  hilo topics create --log kafka://127.0.0.1:9092 --run exp1
  hilo produce --log kafka://127.0.0.1:9092 --run exp1 --steps 200
  hilo consume --log kafka://127.0.0.1:9092 --run exp1 --site eu-1 --state-dir /var/lib/hilo/eu-1
  hilo lag --log kafka://127.0.0.1:9092 --run exp1
  hilo bench codecs --json
"""


def version_line() -> str:
    """The installed version and the formats it speaks: what an operator pastes into a bug report."""
    from importlib.metadata import PackageNotFoundError, version

    from hilo.schemas.framing import SCHEMA_VERSION
    from hilo.schemas.records import DIGEST_VERSION, MATH_VERSION  # imports torch: only when --version is asked
    try:
        installed = version("hilo-sync")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = "unknown (not installed)"
    return (f"hilo-sync {installed} (wire format {SCHEMA_VERSION}, arithmetic {MATH_VERSION}, state digest "
            f"{DIGEST_VERSION}; Python {sys.version.split()[0]})")


class _Version(argparse.Action):
    """--version, computed when asked (argparse's own action takes the string up front, and that import is torch)."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def _chosen(argv) -> str | None:
    """The command named on the command line (the first word that is not an option), if any."""
    args = iter(argv)
    for word in args:
        if word in ("--log-level", "--log-format"):
            next(args, None)
        elif not word.startswith("-"):
            return word
    return None


def parser(argv=None) -> argparse.ArgumentParser:
    """The argument parser. With `argv`, only the command it names gets its full parser (the others are listed
    with their summaries); without, every command's parser is built."""
    ap = argparse.ArgumentParser(prog="hilo", allow_abbrev=False,
                                 description="hilo-sync: keep LoRA policy replicas bit-identical by shipping "
                                             "compressed gradients over a log (Kafka, or an embedded file log).",
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action=_Version,
                    help="print the version, the wire-format, arithmetic and digest versions it speaks, and exit")
    ap.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                    help="default: %(default)s")
    ap.add_argument("--log-format", default="text", choices=["text", "json"],
                    help="json: one JSON object a line (timestamp, level, logger, message) for log shippers (default: "
                         "%(default)s)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = None if argv is None else _chosen(argv)
    for name, (module, summary) in COMMANDS.items():
        if argv is None or name == chosen:
            importlib.import_module(f"hilo.ops.commands.{module}").register(sub)
        else:
            sub.add_parser(name, help=summary)
    return ap


def setup_logging(level: str, fmt: str) -> None:
    """Log lines to stderr: text for people, or JSON objects (python-json-logger) for log shippers."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter
        handler.setFormatter(JsonFormatter("%(levelname)s %(name)s %(message)s", timestamp=True,
                                           rename_fields={"levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


def main(argv=None) -> int:
    """Entry point of the `hilo` console script."""
    from hilo.ops.quiet import silence_unavoidable_warnings
    silence_unavoidable_warnings()
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parser(argv).parse_args(argv)
    setup_logging(a.log_level, a.log_format)
    # `kill -USR1 PID`: every thread's stack to stderr, so a process that stopped moving says where it waits
    if sys.__stderr__ is not None:  # the process's own stderr (sys.stderr may be a capture without a file descriptor)
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    for noisy in ("urllib3", "httpx", "transformers"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    # kafka-python logs each retry of what we then report in one line; DEBUG shows it all
    logging.getLogger("kafka").setLevel(logging.DEBUG if a.log_level == "DEBUG" else logging.CRITICAL)
    try:
        return a.fn(a)
    except HiloError as e:
        print(f"hilo {a.command}: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 1)  # 1; 3 for a state already past --until-version (PastVersion)
    except KeyboardInterrupt:
        return 130
    finally:
        for log in getattr(a, "opened_logs", ()):
            log.close()


if __name__ == "__main__":
    sys.exit(main())
