"""Argument types and option groups the commands share, and options generated from config dataclasses.

A config's fields, defaults and help are written once, in the dataclass: each field declares its help in its
metadata (`opt(default, help)`, schemas/options.py); `config_options` turns fields into options and
`config_from_args` turns parsed options back into the config.
"""
import argparse
import dataclasses
import json
import types
import typing


def kind(name: str):
    """Name an argparse type function for people (docs/cli.md's type column): `@kind("budget")`."""
    def mark(fn):
        fn.kind = name
        return fn
    return mark


@kind("budget")
def budget(text: str):
    """'0.016' (fraction of the bf16 adapter), '1.6%', a byte count like '2MB' / '500000', or 'auto[:SHARE]'
    (fitted to the slowest site's link: replica/codecs/budget.py `parse_budget`)."""
    from hilo.replica.codecs.budget import parse_budget
    from hilo.schemas.errors import ConfigError
    try:
        return parse_budget(text, "--budget")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@kind("fractions")
def fractions(text: str) -> tuple:
    """'1.6%,6.4%' or '0.016,0.064': budgets as fractions of the bf16 adapter (no byte counts)."""
    out = tuple(getattr(budget(t), "fraction", None) for t in text.split(","))
    if None in out:
        raise argparse.ArgumentTypeError(
            f"--budgets {text!r}: give fractions of the adapter (1.6% or 0.016), not bytes")
    return out


@kind("run id")
def run_id(text: str) -> str:
    """A run id, checked by the one rule every backend uses."""
    from hilo.log.base import check_run
    from hilo.schemas.errors import ConfigError
    try:
        return check_run(text, "--run")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def at_least(lo: int):
    """argparse type: an int >= lo."""
    @kind(f"int >= {lo}")
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v} is below the minimum {lo}")
        return v
    return parse


def names(allowed):
    """argparse type: a comma list of names from `allowed` (a registry's keys)."""
    @kind("comma list")
    def parse(text: str) -> list:
        got = [n for n in text.split(",") if n]
        bad = [n for n in got if n not in allowed]
        if bad or not got:
            raise argparse.ArgumentTypeError(f"{text!r}: unknown {bad or 'empty list'}; expected a comma list of "
                                             f"{', '.join(allowed)}")
        return got
    return parse


def command_group(sub, name: str, summary: str):
    """A command whose first argument names an action (`hilo topics create`); returns the actions' subparsers."""
    p = sub.add_parser(name, help=summary)
    return p.add_subparsers(dest=f"{name}_command", required=True, metavar="ACTION")


def log_args(p):
    """--log and --kafka-config."""
    p.add_argument("--log", required=True, metavar="URL",
                   help="file://DIR (embedded log) or kafka://HOST:PORT[,HOST:PORT]")
    p.add_argument("--kafka-config", metavar="FILE",
                   help="Kafka client .properties: security.protocol, ssl.ca.location, "
                   "sasl.mechanism, sasl.username, sasl.password.file, ... (README: Running across sites)")


def common(p):
    """--log, --kafka-config and --run."""
    log_args(p)
    p.add_argument("--run", required=True, type=run_id,
                   help="run id (letters, digits, '_', '-'); topics are RUN.updates "
                   "and RUN.checkpoints")


def open_from(a):
    """The log of `--log`, with the TLS/SASL settings of `--kafka-config`; `hilo`'s main closes it when the command
    returns (a command run in-process, as the tests and `hilo rl` do, leaves no Kafka client behind)."""
    from hilo.log import open_log
    log = open_log(a.log, kafka_config=a.kafka_config)
    a.opened_logs = getattr(a, "opened_logs", []) + [log]
    return log


def existing_run(log, run: str):
    """LogError unless `run` has topics on `log`: says which runs do exist (read-only commands create nothing)."""
    from hilo.log import updates_topic
    from hilo.schemas.errors import LogError, NoSuchTopic
    try:
        log.check_topic(updates_topic(run))
    except NoSuchTopic:
        runs = log.runs()
        shown = ", ".join(runs[:8]) + (f" and {len(runs) - 8} more" if len(runs) > 8 else "") if runs else "none"
        raise LogError(
            f"{log.url}: run {run!r} does not exist; runs here: {shown} (hilo topics list --log {log.url})") from None


def report(subparsers, name, summary, rows_of, format_rows):
    """A read-only command over one run that prints `rows_of(log, run)` as a table, or JSON with --json."""
    p = subparsers.add_parser(name, help=summary)
    common(p)
    p.add_argument("--json", action="store_true", help="print a JSON list")

    def fn(a):
        log = open_from(a)
        existing_run(log, a.run)
        rows = rows_of(log, a.run)
        print(json.dumps(rows, indent=2) if a.json else format_rows(rows))
        return 0
    p.set_defaults(fn=fn)
    return p


# -- options from config dataclasses ----------------------------------------------------------------
def field_help(cls) -> dict:
    """{field: help} of a config dataclass: each field's metadata help (schemas/options.py `opt`). A field that
    declares none (or an empty one) is a TypeError naming the class and field, so no option loses its help."""
    from hilo.schemas.options import help_of
    out = {f.name: help_of(f) for f in dataclasses.fields(cls)}
    missing = [n for n, text in out.items() if not (text and text.strip())]
    if missing:
        raise TypeError(f"{', '.join(f'{cls.__name__}.{n}' for n in missing)}: no help text; declare each field as "
                        f"`name: T = opt(default, \"help\")` (schemas/options.py)")
    return out


def _scalar(annotation):
    """int / float / str of an annotation such as `int | None` (a str enum reads as str)."""
    args = [t for t in typing.get_args(annotation)
            if t is not type(None)] if isinstance(annotation, types.UnionType) else [annotation]
    t = args[0] if args else str
    return t if t in (int, float, str, bool) else str


def shown(default) -> str:
    """A default as an option takes it: a budget's text, an enum's value, else str()."""
    return default.describe() if hasattr(default, "describe") else str(default)


def config_options(p, cls, fields, flags=None, choices=None, types=None):
    """Add one option per field of `cls`: flag --field-name (or flags[field]), type (or types[field]), default and
    help from the dataclass field. A bool field whose default is True becomes a --no-... switch."""
    flags, choices, types, docs = flags or {}, choices or {}, types or {}, field_help(cls)
    hints = typing.get_type_hints(cls)
    for name in fields:
        f = cls.__dataclass_fields__[name]
        default = f.default if f.default is not dataclasses.MISSING else None
        text = docs[name].replace("%", "%%")
        kind = types.get(name, _scalar(hints[name]))
        if kind is bool:
            flag = flags.get(name, ("--no-" if default else "--") + name.replace("_", "-"))
            action = p.add_argument(flag, dest=name, action="store_false" if default else "store_true",
                                    help=f"turn off (on by default): {text}" if default else text)
        else:
            flag = flags.get(name, "--" + name.replace("_", "-"))
            suffix = f" (default: {shown(default)})".replace("%", "%%") if default is not None else ""
            action = p.add_argument(flag, dest=name, type=kind, default=default, choices=choices.get(name),
                                    help=text + suffix,
                                    metavar=None if name in choices else flag[2:].upper().replace("-", "_"))
        action.config_field = f"{cls.__name__}.{name}"  # what the CLI reference (ops/cli_reference.py) links it to


def config_from_args(cls, a, **given):
    """`cls` built from the parsed options named like its fields (and `given`)."""
    values = {n: getattr(a, n) for n in cls.__dataclass_fields__ if hasattr(a, n)}
    return cls(**(values | given))


def metrics_options(p):
    """--metrics-port, --metrics-host and --ready-max-lag (ops/metrics_server.py)."""
    from hilo.ops.metrics_server import MetricsConfig
    config_options(p, MetricsConfig, ("metrics_port", "metrics_host", "ready_max_lag"))


def metrics_server(a, registry):
    """The endpoint of --metrics-port over `registry`, bound now (None without the option)."""
    if a.metrics_port is None:
        return None
    from hilo.ops.metrics_server import MetricsConfig, MetricsServer
    return MetricsServer(config_from_args(MetricsConfig, a), registry)
