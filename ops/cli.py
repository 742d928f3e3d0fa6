"""The `hilo` command: run the producer, consumers, and operator tools. `hilo COMMAND --help` for each."""
import argparse
import json
import logging
import sys

from hilo.schemas.errors import HiloError

EPILOG = """examples:
  hilo demo                                              # everything on one machine, no broker
  hilo topics create --log kafka://127.0.0.1:9092 --run exp1
  hilo produce --log kafka://127.0.0.1:9092 --run exp1 --steps 200
  hilo consume --log kafka://127.0.0.1:9092 --run exp1 --site eu-1 --state-dir /var/lib/hilo/eu-1
  hilo lag --log kafka://127.0.0.1:9092 --run exp1
  hilo bench codecs --json
"""


def _budget(text: str):
    """'0.016' (fraction of the bf16 adapter), '1.6%', or a byte count like '2MB' / '500000'."""
    from hilo.replica.codecs import Budget
    t = text.strip().upper()
    try:
        if t.endswith("%"):
            return Budget(fraction=float(t[:-1]) / 100)
        for suffix, mult in (("KB", 1e3), ("MB", 1e6), ("GB", 1e9), ("B", 1)):
            if t.endswith(suffix):
                return Budget(fraction=None, bytes=int(float(t[: -len(suffix)]) * mult))
        v = float(t)
        return Budget(fraction=v) if v <= 4 else Budget(fraction=None, bytes=int(v))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: {e}") from None


def _fractions(text: str) -> tuple:
    """'1.6%,6.4%' or '0.016,0.064': budgets as fractions of the bf16 adapter (no byte counts)."""
    out = tuple(_budget(t).fraction for t in text.split(","))
    if None in out:
        raise argparse.ArgumentTypeError(f"--budgets {text!r}: give fractions of the adapter (1.6% or 0.016), not bytes")
    return out


def _run(text: str) -> str:
    """A run id, checked by the one rule every backend uses."""
    from hilo.log.base import check_run
    from hilo.schemas.errors import ConfigError
    try:
        return check_run(text, "--run")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _at_least(lo: int):
    """argparse type: an int >= lo."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v} is below the minimum {lo}")
        return v
    return parse


def _names(allowed):
    """argparse type: a comma list of names from `allowed` (a registry's keys)."""
    def parse(text: str) -> list:
        names = [n for n in text.split(",") if n]
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: unknown {bad or 'empty list'}; expected a comma list of {', '.join(allowed)}")
        return names
    return parse


def _existing_run(log, run: str):
    """LogError unless `run` has topics on `log`: says which runs do exist (read-only commands create nothing)."""
    from hilo.log import updates_topic
    from hilo.schemas.errors import LogError, NoSuchTopic
    try:
        log.check_topic(updates_topic(run))
    except NoSuchTopic:
        runs = log.runs()
        shown = ", ".join(runs[:8]) + (f" and {len(runs) - 8} more" if len(runs) > 8 else "") if runs else "none"
        raise LogError(f"{log.url}: run {run!r} does not exist; runs here: {shown} (hilo topics list --log {log.url})") from None


def _open(a):
    """The log of `--log`, with the TLS/SASL settings of `--kafka-config`."""
    from hilo.log import open_log
    return open_log(a.log, kafka_config=a.kafka_config)


def cmd_demo(a):
    from hilo.ops.demo import run_demo
    return run_demo(a.log, a.steps, a.json)


def cmd_keys_generate(a):
    from hilo.schemas.signing import Verifier, generate
    private, public = generate(a.out)
    print(f"{private} (the trainer's: --signing-key; mode 0600)\n{public} (for every site: --trust; key id "
          f"{Verifier.load(public).key_id.hex()})")
    return 0


def cmd_acls_grant(a):
    from hilo.ops.acls import grant
    n = grant(_open(a), a.run, {"trainer": a.trainer, "site": a.site})
    print(f"{n} ACLs for run {a.run}: {a.trainer} moves the policy, {a.site} reads it and commits hilo.{a.run}.* groups")
    return 0


def cmd_acls_show(a):
    from hilo.ops.acls import show
    rows = show(_open(a), a.run)
    if a.json:
        print(json.dumps(rows, indent=2))
    for r in [] if a.json else rows:
        print(f"{r['principal']:<20} {r['operation']:<17} {r['resource']:<17} {r['name']} ({r['pattern']})")
    return 0


def cmd_topics_list(a):
    for run in _open(a).runs():
        print(run)
    return 0


def _report(a, rows_of, format_rows):
    """Open the log, check that the run exists, print `rows_of(log, run)` as JSON or as a table."""
    log = _open(a)
    _existing_run(log, a.run)
    rows = rows_of(log, a.run)
    print(json.dumps(rows, indent=2) if a.json else format_rows(rows))
    return 0


def cmd_topics_describe(a):
    from hilo.ops.describe import describe_run, format_rows
    return _report(a, describe_run, format_rows)


def cmd_topics(a):
    log = _open(a)
    created = log.create_topics(a.run, a.retention_ms)
    for t in (f"{a.run}.updates", f"{a.run}.checkpoints"):
        print(f"{t}: {'created' if t in created else 'exists, checked (1 partition, cleanup.policy=delete)'}")
    return 0


def cmd_produce(a):
    from hilo.producer.producer import HiLoProducer, ProducerConfig
    from hilo.ops.tiny_trainer import build_model, train
    cfg = ProducerConfig(run=a.run, log=a.log, codec=a.codec, budget=a.budget, optimizer=a.optimizer,
                         checkpoint_every=a.checkpoint_every, state_dir=a.state_dir, new_history=a.new_history,
                         signing_key=a.signing_key, kafka_config=a.kafka_config, history=a.history, mode=a.mode)
    producer = HiLoProducer(build_model(seed=a.seed), cfg)
    adapter = producer.manifest.adapter_bytes()

    def on_step(version, loss, compute_s, info):
        print(f"v{version} loss {loss:.4f} bytes {info['bytes']} ({100 * info['bytes'] / adapter:.2f}% of adapter) "
              f"chunks {info['chunks']} compute {compute_s * 1e3:.0f} ms sync {info['total_s'] * 1e3:.0f} ms"
              + (f" lag {info['lag']:.2e}" if a.mode == "delta" else ""), flush=True)
    train(producer, a.steps, lr=a.lr, seed=a.seed, on_step=on_step)
    flushed = producer.flush()
    print(f"done: v{producer.version} digest {producer.replica.digest.hex()}"
          + (f" (flush: {flushed} message(s), lag {producer.lag():.2e})" if a.mode == "delta" else ""))
    producer.close()
    return 0


def cmd_consume(a):
    from hilo.consumer.site import Site, SiteConfig
    cfg = SiteConfig(log=a.log, run=a.run, site=a.site, state_dir=a.state_dir, snapshot_every=a.snapshot_every,
                     export_adapters=not a.no_export, export_dtype=a.export_dtype, keep_adapters=a.keep_adapters,
                     on_version=a.on_version, vllm=a.vllm, lora_name=a.lora_name, from_offset=a.from_offset,
                     from_version=a.from_version, until_version=a.until_version, trust=a.trust, idle_exit_s=a.idle_exit,
                     wait_checkpoint_s=a.wait_checkpoint, kafka_config=a.kafka_config, history=a.history)
    site = Site.open(cfg)
    site.install_signal_handlers()
    v = site.run(progress=False if a.no_progress else None)
    print(f"{a.site}: v{v} digest {site.follower.replica.digest.hex()}")
    return 0


def cmd_lag(a):
    from hilo.ops.lag import format_rows, lag_rows
    return _report(a, lag_rows, format_rows)


def cmd_inspect(a):
    from hilo.ops.inspect_version import describe
    from hilo.log import checkpoints_topic
    from hilo.log.tail import last_message
    from hilo.schemas.records import decode_record
    log = _open(a)
    _existing_run(log, a.run)
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


def cmd_bench_codecs(a):
    from hilo.ops.bench.codecs import run, table
    rows = run(a.shapes, a.codecs, a.optimizers, a.steps, a.budget)
    print(json.dumps(rows, indent=2) if a.json else table(rows))
    return 0


def cmd_bench_quality(a):
    from hilo.ops.bench.quality import SweepConfig, main as quality
    lists = {k: tuple(getattr(a, k).split(",")) for k in ("tasks", "optimizers", "syncs") if getattr(a, k)}
    cfg = SweepConfig(quick=a.quick, steps=a.steps, seeds=a.seeds, workers=a.workers, budgets=a.budgets,
                      saved_only=a.saved_only, **lists)
    return quality(cfg, a.json, a.out)


def cmd_bench_serve(a):
    from hilo.ops.bench.serve import main as serve
    return serve(a.json, a.shapes, a.versions, a.out)


def cmd_bench_faults(a):
    from hilo.ops.bench.faults import main as faults
    return faults(a.json, a.log, a.kills, a.trainer_kills, a.out, a.seed)


def cmd_bench_publish(a):
    from hilo.ops.bench.publish import main as publish
    return publish(a.json, a.log, a.bytes, a.rounds, a.out)


def cmd_bench_wan(a):
    from hilo.ops.bench.wan import main as wan
    return wan(a.json, a.steps, a.compute_s, a.links, a.sites, a.out, a.shape)


def parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand; codec, optimizer and shape names come from their registries."""
    from hilo.ops.bench.onpolicy import SYNCS
    from hilo.ops.bench.quality import PLAN, QUICK_SYNCS
    from hilo.ops.bench.serve import SHAPES as SERVE_SHAPES
    from hilo.ops.bench.synthetic import QWEN3
    from hilo.producer.delta import MODES
    from hilo.producer.producer import ProducerConfig
    from hilo.replica.codecs import CODECS
    from hilo.replica.optimizers import OPTIMIZERS
    codecs, optimizers, shapes = list(CODECS), list(OPTIMIZERS), list(QWEN3)
    ap = argparse.ArgumentParser(prog="hilo", description="hilo-sync: keep LoRA policy replicas bit-identical by shipping "
                                 "compressed gradients over a log (Kafka, or an embedded file log).",
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default: %(default)s")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def report(subparsers, name, summary, fn):
        """A read-only command over one run that prints a table, or JSON with --json."""
        p = subparsers.add_parser(name, help=summary)
        common(p)
        p.add_argument("--json", action="store_true", help="print a JSON list")
        p.set_defaults(fn=fn)

    def log_args(p):
        p.add_argument("--log", required=True, metavar="URL", help="file://DIR (embedded log) or kafka://HOST:PORT[,HOST:PORT]")
        p.add_argument("--kafka-config", metavar="FILE", help="Kafka client .properties: security.protocol, ssl.ca.location, "
                       "sasl.mechanism, sasl.username, sasl.password.file, ... (README: Running across sites)")

    def common(p):
        log_args(p)
        p.add_argument("--run", required=True, type=_run, help="run id (letters, digits, '_', '-'); topics are RUN.updates "
                       "and RUN.checkpoints")

    p = sub.add_parser("demo", help="trainer + 3 sites (one killed and restarted) on an embedded log; exit 0 if all match")
    p.add_argument("--log", default=None, metavar="URL", help="default: file:// log in a temp folder (no broker)")
    p.add_argument("--steps", type=_at_least(3), default=40, help="training steps / versions, >= 3: site-2 is killed at a third "
                   "and restarted at two thirds (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser("topics", help="create and check a run's topics")
    tsub = p.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    c = tsub.add_parser("create", help="create RUN.updates (1 partition, delete policy) and RUN.checkpoints; check existing ones")
    common(c)
    c.add_argument("--retention-ms", type=int, default=-1, help="retention of both topics; -1 keeps forever (default)")
    c.set_defaults(fn=cmd_topics)
    c = tsub.add_parser("list", help="the runs on a log (topics RUN.updates)")
    log_args(c)
    c.set_defaults(fn=cmd_topics_list)
    report(tsub, "describe", "a run's topics: retained offsets and versions, retention", cmd_topics_describe)

    p = sub.add_parser("acls", help="Kafka ACLs of a run on a secured cluster (--kafka-config of an admin)")
    asub = p.add_subparsers(dest="acls_command", required=True, metavar="ACTION")
    c = asub.add_parser("grant", help="the trainer may write the run's topics; sites may read them and commit hilo.RUN.* groups")
    common(c)
    c.add_argument("--trainer", required=True, metavar="USER", help="the trainer's principal (User:NAME or NAME)")
    c.add_argument("--site", required=True, metavar="USER", help="the sites' principal (User:NAME or NAME)")
    c.set_defaults(fn=cmd_acls_grant)
    c = asub.add_parser("show", help="the ACLs the cluster holds on the run's topics, groups and transactional id")
    common(c)
    c.add_argument("--json", action="store_true", help="print a JSON list")
    c.set_defaults(fn=cmd_acls_show)

    p = sub.add_parser("keys", help="signing keys for a run")
    ksub = p.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    k = ksub.add_parser("generate", help="an Ed25519 key pair: OUT/trainer.key (mode 0600) and OUT/trainer.pub")
    k.add_argument("--out", required=True, metavar="DIR", help="directory to write the two files into (never overwrites)")
    k.set_defaults(fn=cmd_keys_generate)

    p = sub.add_parser("produce", help="run the built-in tiny trainer as a standalone producer")
    common(p)
    p.add_argument("--codec", default=ProducerConfig.codec, choices=codecs, help="default: %(default)s")
    p.add_argument("--budget", type=_budget, default="1.6%", help="bytes per message: 1.6%%, 0.016, 2MB or 2000000 (default: 1.6%%)")
    p.add_argument("--optimizer", default=ProducerConfig.optimizer, choices=optimizers, help="the trainer's optimizer (default: %(default)s)")
    p.add_argument("--mode", default=ProducerConfig.mode, choices=list(MODES), help="what each message carries: " +
                   "; ".join(f"{k}: {v}" for k, v in MODES.items()) + " (default: %(default)s)")
    p.add_argument("--steps", type=_at_least(1), default=100, help="training steps to run (default: %(default)s)")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate (default: %(default)s)")
    p.add_argument("--checkpoint-every", type=_at_least(1), default=50, help="full checkpoint every K versions (default: %(default)s)")
    p.add_argument("--state-dir", default=None, help="trainer snapshot dir for fast restarts (default: resume from the log)")
    p.add_argument("--seed", type=int, default=0, help="model/data seed (default: %(default)s)")
    p.add_argument("--signing-key", metavar="FILE", help="Ed25519 private key (hilo keys generate) that signs every update "
                   "and checkpoint")
    p.add_argument("--history", metavar="FILE", help="append (version, digest, offset) of each acknowledged version (fault tests)")
    p.add_argument("--new-history", action="store_true", help="start a new genesis although this run's earlier records expired "
                   "(sites of the old history refuse it until reset); without it the trainer refuses")
    p.set_defaults(fn=cmd_produce)

    p = sub.add_parser("consume", help="follow a run at a rollout site: apply, export adapters, snapshot")
    common(p)
    p.add_argument("--site", required=True, help="this site's name (its consumer group is hilo.RUN.SITE)")
    p.add_argument("--state-dir", required=True, help="snapshot + exported adapters live here")
    p.add_argument("--snapshot-every", type=_at_least(1), default=10, help="snapshot every K versions (default: %(default)s)")
    p.add_argument("--no-export", action="store_true", help="do not write PEFT adapter dirs")
    p.add_argument("--export-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"], help="default: %(default)s")
    p.add_argument("--keep-adapters", type=_at_least(1), default=3, help="newest N adapter dirs kept (default: %(default)s)")
    p.add_argument("--on-version", metavar="CMD", help="shell command after each newest version is exported (env HILO_VERSION, "
                   "HILO_ADAPTER_DIR, HILO_DIGEST); for engines other than vLLM")
    p.add_argument("--vllm", metavar="URL", help="vLLM server to serve each newest version (started with --enable-lora and "
                   "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; ops/vllm/start.sh does both)")
    p.add_argument("--trust", metavar="FILE", help="the trainer's public key (trainer.pub): apply only what it signed")
    p.add_argument("--lora-name", default="policy", help="adapter name rollout requests to vLLM use (default: %(default)s)")
    p.add_argument("--from-offset", type=_at_least(0), help="start reading RUN.updates at this offset")
    p.add_argument("--from-version", type=_at_least(0), help="ignore the snapshot; replay from the newest checkpoint <= V")
    p.add_argument("--until-version", type=_at_least(0), help="exit once this version is applied")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS", help="exit after this long with no new version")
    p.add_argument("--wait-checkpoint", type=float, default=600, metavar="SECONDS", help="wait for the first checkpoint (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while catching up")
    p.add_argument("--history", metavar="FILE", help="append (version, digest, offset) of each applied version (fault tests)")
    p.set_defaults(fn=cmd_consume)

    report(sub, "lag", "applied and serving version, lag in versions and bytes, offsets, age: one row per site", cmd_lag)

    p = sub.add_parser("inspect", help="one update's header fields and per-block rank/k and bytes")
    common(p)
    p.add_argument("--version", type=_at_least(1), required=True, help="policy version to show")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(fn=cmd_inspect)

    p = sub.add_parser("bench", help="benchmarks (JSON with --json)")
    bsub = p.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    b = bsub.add_parser("codecs", help="message bytes, encode ms, decode+apply ms, error per codec x optimizer")
    b.add_argument("--shapes", type=_names(shapes), default="qwen3-1.7b,qwen3-0.6b", help=f"comma list of {', '.join(shapes)} (default: %(default)s)")
    b.add_argument("--codecs", type=_names(codecs), default=",".join(codecs), help="default: %(default)s")
    b.add_argument("--optimizers", type=_names(optimizers), default=",".join(optimizers), help="default: %(default)s")
    b.add_argument("--steps", type=_at_least(1), default=3, help="timed messages per row after one warm-up (default: %(default)s)")
    b.add_argument("--budget", type=_budget, default="1.6%", help="default: %(default)s")
    b.add_argument("--json", action="store_true", help="print a JSON list of rows")
    b.set_defaults(fn=cmd_bench_codecs)
    q = bsub.add_parser("quality", help="on-policy distillation and RL: pass@1/pass@4 per optimizer x sync method")
    q.add_argument("--quick", action="store_true", help="smoke run of a few minutes (what CI runs)")
    q.add_argument("--steps", type=_at_least(1), help="training steps per run (default: 8 quick, 60 full)")
    q.add_argument("--seeds", type=_at_least(1), help="test seeds per cell (default: 1 quick, 5 full)")
    q.add_argument("--workers", type=_at_least(1), default=2, help="parallel runs, one torch thread each (default: %(default)s)")
    q.add_argument("--tasks", help="comma list of distill, rl (default: both)")
    q.add_argument("--optimizers", help=f"comma list of {', '.join(optimizers)} (default: all)")
    q.add_argument("--syncs", help=f"comma list of {', '.join(SYNCS)} (default: all; quick: {','.join(QUICK_SYNCS)})")
    q.add_argument("--budgets", type=_fractions, help="comma list of per-message budgets as fractions of the bf16 adapter; "
                   "every lossy sync runs at each (default: each sync's own, " +
                   "; ".join(f"{s} {','.join(f'{100 * b:g}%%' for b in bs)}" for s, bs in PLAN.items() if s != "full") + ")")
    q.add_argument("--out", metavar="DIR", help="results folder; an existing one resumes its saved runs "
                   "(default: ~/.cache/hilo-sync/bench/quality-TIME)")
    q.add_argument("--saved-only", action="store_true",
                   help="compute nothing: report the runs already saved under --out (a sweep in progress or stopped)")
    q.add_argument("--json", action="store_true", help="print the results object (with a `cells` list)")
    q.set_defaults(fn=cmd_bench_quality)
    s = bsub.add_parser("serve", help="publish -> first vLLM request served by the new version (apply, export, reload), per version")
    s.add_argument("--shapes", type=_names(list(SERVE_SHAPES)), default="tiny,qwen3-0.6b",
                   help=f"comma list of {', '.join(SERVE_SHAPES)} (default: %(default)s)")
    s.add_argument("--versions", type=_at_least(1), default=5, help="timed versions per shape after one warm-up (default: %(default)s)")
    s.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/serve-TIME)")
    s.add_argument("--json", action="store_true", help="print the results object")
    s.set_defaults(fn=cmd_bench_serve)
    def kafka_bench(name, summary, fn):
        """A benchmark on a Kafka log: --log, --out, --json; returns its parser for the rest."""
        b = bsub.add_parser(name, help=summary)
        b.add_argument("--log", default="kafka://127.0.0.1:9092", metavar="URL", help="the log (default: %(default)s, "
                       "ops/kafka/start.sh)")
        b.add_argument("--out", metavar="DIR", help=f"results folder (default: ~/.cache/hilo-sync/bench/{name}-TIME)")
        b.add_argument("--json", action="store_true", help="print the results object")
        b.set_defaults(fn=fn)
        return b

    f = kafka_bench("faults", "SIGKILL trainers and sites at every named crash point; check every history", cmd_bench_faults)
    f.add_argument("--kills", type=_at_least(1), default=200, help="site SIGKILLs (default: %(default)s)")
    f.add_argument("--trainer-kills", type=_at_least(0), default=20, help="trainer SIGKILLs (default: %(default)s)")
    f.add_argument("--seed", type=int, default=0, help="which crash counts and instants (default: %(default)s)")
    b = kafka_bench("publish", "per-version publish time on Kafka: plain append vs in a transaction", cmd_bench_publish)
    b.add_argument("--bytes", type=_at_least(1), default=100_000, help="record size (default: %(default)s)")
    b.add_argument("--rounds", type=_at_least(1), default=6, help="rounds of 8 versions each (default: %(default)s)")
    w = bsub.add_parser("wan", help="freshness and step time over tc-shaped links (needs root, ip, tc; Java for Kafka)")
    w.add_argument("--steps", type=_at_least(1), default=2, help="messages per method and config (default: %(default)s)")
    w.add_argument("--compute-s", type=float, default=8.0,
                   help="trainer compute per step (default: %(default)s s, a Qwen3-1.7B GRPO step's order of magnitude)")
    w.add_argument("--links", default="100,1000", help="link rates in Mbit/s (default: %(default)s)")
    w.add_argument("--sites", default="1,4", help="site counts (default: %(default)s)")
    w.add_argument("--shape", default="qwen3-1.7b", choices=shapes, help="adapter shape (default: %(default)s)")
    w.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/wan-TIME)")
    w.add_argument("--json", action="store_true", help="print the results object (with a `rows` list)")
    w.set_defaults(fn=cmd_bench_wan)
    return ap


def main(argv=None) -> int:
    """Entry point of the `hilo` console script."""
    from hilo.ops.quiet import silence_unavoidable_warnings
    silence_unavoidable_warnings()
    a = parser().parse_args(argv)
    logging.basicConfig(level=a.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("urllib3", "httpx", "transformers"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    # kafka-python logs each retry of what we then report in one line; DEBUG shows it all
    logging.getLogger("kafka").setLevel(logging.DEBUG if a.log_level == "DEBUG" else logging.CRITICAL)
    try:
        return a.fn(a)
    except HiloError as e:
        print(f"hilo {a.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
