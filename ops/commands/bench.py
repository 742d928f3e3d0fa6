"""`hilo bench NAME`: the benchmarks, each printing JSON with --json and writing its results folder."""
import argparse
import json

from . import COMMANDS
from .args import at_least, budget, config_from_args, config_options, fractions, names


def codecs(a):
    """Bytes, encode and apply time, error per codec x optimizer."""
    from hilo.ops.bench.codecs import run, table
    from hilo.ops.bench.machine import measured_on
    res = {"measured_on": measured_on(), "rows": run(a.shapes, a.codecs, a.optimizers, a.steps, a.budget)}
    print(json.dumps(res, indent=2) if a.json else table(res))
    return 0


def quality(a):
    """The quality sweep."""
    from hilo.ops.bench.quality import SweepConfig, main
    lists = {k: tuple(getattr(a, k).split(",")) for k in ("tasks", "optimizers", "syncs") if getattr(a, k)}
    cfg = SweepConfig(quick=a.quick, steps=a.steps, seeds=a.seeds, workers=a.workers, budgets=a.budgets,
                      saved_only=a.saved_only, student=a.student, lrs_from=a.lrs_from,
                      eval_problems=a.eval_problems, **lists)
    return main(cfg, a.json, a.out)


def serve(a):
    """Publish -> served by vLLM, per version."""
    from hilo.ops.bench.serve import main
    return main(a.json, a.shapes, a.versions, a.out)


def faults(a):
    """SIGKILLs at every crash point, then the history check."""
    from hilo.ops.bench.faults import main
    return main(a.json, a.log, a.kills, a.trainer_kills, a.out, a.seed)


def fuzz(a):
    """Mutated inputs through every decoder: each refused by name or accepted as the original."""
    from hilo.ops.bench.fuzz import FuzzConfig, main
    return main(config_from_args(FuzzConfig, a), a.json, a.out)


def publish(a):
    """Publish time, plain append vs transaction."""
    from hilo.ops.bench.publish import main
    return main(a.json, a.log, a.bytes, a.rounds, a.out)


def wan(a):
    """Freshness and step time over shaped links."""
    from hilo.ops.bench.wan import main
    return main(a.json, a.steps, a.compute_s, a.links, a.sites, a.out, a.shape)


def rl(a):
    """Synchronous against asynchronous RL across sites."""
    import dataclasses
    from hilo.ops.bench.rl import QUICK, BenchConfig, main
    cfg = config_from_args(BenchConfig, a, staleness=tuple(a.staleness))
    return main(dataclasses.replace(cfg, **QUICK) if a.quick else cfg, a.json, a.out)


def audit(a):
    """The audit's calibration and cost: honest runs at each audited share."""
    from hilo.ops.bench.audit import AuditBenchConfig, main
    return main(config_from_args(AuditBenchConfig, a, shares=tuple(a.shares), served=tuple(a.served)), a.json, a.out)


def replay(a):
    """Catch-up rate and snapshot cost at a real adapter's shape."""
    from hilo.ops.bench.replay import main
    return main(a.json, a.shape, a.behind, a.optimizers, a.out, a.apply)


def pace(a):
    """A site following a run that gains a version every second, at a real adapter's shape."""
    from hilo.ops.bench.pace import PaceConfig, main
    return main(config_from_args(PaceConfig, a), a.json, a.out)


def scrape(a):
    """/metrics latency and lag consistency while a site catches up."""
    from hilo.ops.bench.scrape import main
    return main(a.json, a.shape, a.versions, a.every_ms, a.out)


def snapshot(a):
    """Snapshot save and load time and size by format, and the apply loop's stall per background snapshot."""
    from hilo.ops.bench.snapshot import main
    argv = ["--shape", a.shape, "--repeats", str(a.repeats)] + [x for s in a.state or () for x in ("--state", s)]
    return main(argv + (["--out", a.out] if a.out else []) + (["--json"] if a.json else []))


def ranks(a):
    """A multi-rank trainer's step against a lone one's: the broadcast and the other ranks' apply."""
    from hilo.ops.bench.ranks import main
    return main(["--shape", a.shape, "--codec", a.codec, "--steps", str(a.steps), "--rounds", str(a.rounds),
                 "--ranks", a.ranks]
                + (["--out", a.out] if a.out else [])
                + (["--json"] if a.json else []))


def trainer(a):
    """A step's cost with hilo-sync against plain AdamW: encode, apply, publish wait, step, on 1 and 2 ranks."""
    from hilo.ops.bench.trainer import main
    return main(["--shape", a.shape, "--steps", str(a.steps), "--kafka", a.kafka, "--compute-s", str(a.compute_s),
                 "--wan-port", str(a.wan_port)]
                + (["--rtt-ms", ",".join(map(str, a.rtt_ms))] if a.rtt_ms else [])
                + (["--rows", ",".join(a.rows)] if a.rows else [])
                + (["--out", a.out] if a.out else []) + (["--json"] if a.json else []))


def probe(a):
    """Per block and version: the compressed method's step against the uncompressed shadow's."""
    from hilo.ops.bench.probe import ProbeConfig, main
    return main(config_from_args(ProbeConfig, a, optimizers=tuple(a.optimizers), lrs=tuple(a.lrs),
                                 seeds=tuple(a.seeds)), a.json, a.out)


def fanout(a):
    """Freshness and egress as sites multiply, on one cluster and split over a mirror."""
    from hilo.ops.bench.fanout import FanoutConfig, main
    return main(config_from_args(FanoutConfig, a, sites=tuple(a.sites)), a.json, a.out)


def register(sub):
    """The bench command group; codec, optimizer, shape and sync names come from their registries."""
    from hilo.ops.bench import trainer_flags
    from hilo.ops.bench.onpolicy import SYNCS
    from hilo.ops.bench.quality import PLAN, QUICK_SYNCS
    from hilo.ops.bench.rl import BenchConfig
    from hilo.ops.bench.serve import SHAPES as SERVE_SHAPES
    from hilo.replica.synthetic import QWEN3
    from hilo.replica.codecs import CODECS
    from hilo.replica.optimizers import OPTIMIZERS
    all_codecs, optimizers, shapes = list(CODECS), list(OPTIMIZERS), list(QWEN3)
    p = sub.add_parser("bench", help=COMMANDS["bench"][1])
    bsub = p.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    b = bsub.add_parser("codecs", help="message bytes, encode ms, decode+apply ms, error per codec x optimizer")
    b.add_argument("--shapes", type=names(shapes), default="qwen3-1.7b,qwen3-0.6b",
                   help=f"comma list of {', '.join(shapes)} (default: %(default)s)")
    b.add_argument("--codecs", type=names(all_codecs), default=",".join(all_codecs), help="default: %(default)s")
    b.add_argument("--optimizers", type=names(optimizers), default=",".join(optimizers), help="default: %(default)s")
    b.add_argument("--steps", type=at_least(1), default=3,
                   help="timed messages per row after one warm-up (default: %(default)s)")
    b.add_argument("--budget", type=budget, default="1.6%", help="default: %(default)s")
    b.add_argument("--json", action="store_true", help="print a JSON list of rows")
    b.set_defaults(fn=codecs)
    q = bsub.add_parser("quality", help="on-policy distillation and RL: pass@1/pass@4 per optimizer x sync method")
    q.add_argument("--quick", action="store_true", help="smoke run of a few minutes (what CI runs)")
    q.add_argument("--steps", type=at_least(1), help="training steps per run (default: 8 quick, 60 full)")
    q.add_argument("--seeds", type=at_least(1), help="test seeds per cell (default: 1 quick, 5 full)")
    q.add_argument("--workers", type=at_least(1), default=2,
                   help="parallel runs, one torch thread each (default: %(default)s)")
    q.add_argument("--eval-problems", type=at_least(1),
                   help="held-out problems each run is scored on, a fixed seeded subset "
                   "(default: 128 quick, the whole split full)")
    q.add_argument("--tasks", help="comma list of distill, rl (default: both)")
    q.add_argument("--optimizers", help=f"comma list of {', '.join(optimizers)} (default: all)")
    q.add_argument("--syncs", help=f"comma list of {', '.join(SYNCS)} (default: all; quick: {','.join(QUICK_SYNCS)})")
    q.add_argument("--budgets", type=fractions,
                   help="comma list of per-message budgets as fractions of the bf16 adapter; "
                   "every lossy sync runs at each (default: each sync's own, " +
                   "; ".join(f"{s} {','.join(f'{100 * b:g}%%' for b in bs)}" for s, bs in PLAN.items()
                             if s != "full") + ")")
    q.add_argument("--out", metavar="DIR", help="results folder; an existing one resumes its saved runs "
                   "(default: ~/.cache/hilo-sync/bench/quality-TIME)")
    q.add_argument("--saved-only", action="store_true",
                   help="compute nothing: report the runs already saved under --out (a sweep in progress or stopped)")
    q.add_argument("--json", action="store_true", help="print the results object (with a `cells` list)")
    from hilo.ops.pretrain import STUDENTS
    q.add_argument("--student", choices=list(STUDENTS),
                   help="the student's shape (default: smoke with --quick, a small pair "
                   "pretrained in a minute that checks the pipeline, not quality; h256-l4 otherwise)")
    q.add_argument("--lrs-from", metavar="QUALITY_JSON", help="take every cell's learning rate from an earlier sweep's "
                   "quality.json instead of tuning (another student shape at a fraction of the cost)")
    q.set_defaults(fn=quality)
    s = bsub.add_parser("serve", help="publish -> first vLLM request served by the new version (apply, export, "
                                      "reload), per version")
    s.add_argument("--shapes", type=names(list(SERVE_SHAPES)), default="tiny,qwen3-0.6b",
                   help=f"comma list of {', '.join(SERVE_SHAPES)} (default: %(default)s)")
    s.add_argument("--versions", type=at_least(1), default=5,
                   help="timed versions per shape after one warm-up (default: %(default)s)")
    s.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/serve-TIME)")
    s.add_argument("--json", action="store_true", help="print the results object")
    s.set_defaults(fn=serve)

    def kafka_bench(name, summary, fn):
        """A benchmark on a Kafka log: --log, --out, --json; returns its parser for the rest."""
        b = bsub.add_parser(name, help=summary)
        b.add_argument("--log", default="kafka://127.0.0.1:9092", metavar="URL", help="the log (default: %(default)s, "
                       "ops/kafka/start.sh)")
        b.add_argument("--out", metavar="DIR", help=f"results folder (default: ~/.cache/hilo-sync/bench/{name}-TIME)")
        b.add_argument("--json", action="store_true", help="print the results object")
        b.set_defaults(fn=fn)
        return b

    f = kafka_bench("faults", "SIGKILL trainers and sites at every named crash point; check every history", faults)
    f.add_argument("--kills", type=at_least(1), default=200, help="site SIGKILLs (default: %(default)s)")
    f.add_argument("--trainer-kills", type=at_least(0), default=20, help="trainer SIGKILLs (default: %(default)s)")
    f.add_argument("--seed", type=int, default=0, help="which crash counts and instants (default: %(default)s)")
    import hilo.ops.bench.fuzz as fuzz_bench
    from hilo.ops.bench.fuzz import FuzzConfig
    fz = bsub.add_parser("fuzz", help="mutated update messages, checkpoints, snapshots and chunk headers: each refused "
                         "by a HiloError naming it or accepted as the original; nothing changed, memory bounded",
                         description=fuzz_bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    config_options(fz, FuzzConfig, ("scale", "seed"))
    fz.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/fuzz-TIME)")
    fz.add_argument("--json", action="store_true", help="print the results object (with `kinds` and `ok`)")
    fz.set_defaults(fn=fuzz)
    b = kafka_bench("publish", "per-version publish time on Kafka: plain append vs in a transaction", publish)
    b.add_argument("--bytes", type=at_least(1), default=100_000, help="record size (default: %(default)s)")
    b.add_argument("--rounds", type=at_least(1), default=6, help="rounds of 8 versions each (default: %(default)s)")
    w = bsub.add_parser("wan", help="freshness and step time over tc-shaped links (needs root, ip, tc; Java for Kafka)")
    w.add_argument("--steps", type=at_least(1), default=3,
                   help="timed messages per method and config after a warm-up (default: %(default)s)")
    w.add_argument("--compute-s", type=float, default=8.0,
                   help="trainer compute per step (default: %(default)s s, a Qwen3-1.7B GRPO step's order of "
                        "magnitude)")
    w.add_argument("--links", default="10,100,1000", help="link rates in Mbit/s (default: %(default)s)")
    w.add_argument("--sites", default="1,4", help="site counts (default: %(default)s)")
    w.add_argument("--shape", default="qwen3-1.7b", choices=shapes, help="adapter shape (default: %(default)s)")
    w.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/wan-TIME)")
    w.add_argument("--json", action="store_true", help="print the results object (with a `rows` list)")
    w.set_defaults(fn=wan)
    from hilo.ops.bench.replay import APPLY as REPLAY_APPLY
    from hilo.ops.bench.replay import OPTIMIZERS as REPLAY_OPTIMIZERS
    rp = bsub.add_parser("replay",
                         help="a site N versions behind catches up: versions/s, time per stage; snapshot save/load "
                         "time and size (AdamW, SGD, a delta-mode site)")
    rp.add_argument("--shape", default="qwen3-1.7b", choices=shapes,
                    help="adapter shape, LoRA r64 (default: %(default)s)")
    rp.add_argument("--behind", type=at_least(1), default=100, help="versions the site replays (default: %(default)s)")
    rp.add_argument("--optimizers", type=names(list(REPLAY_OPTIMIZERS)), default=",".join(REPLAY_OPTIMIZERS),
                    help="comma list; add = a delta-mode site (default: %(default)s)")
    rp.add_argument("--apply", type=names(list(REPLAY_APPLY)), default=",".join(REPLAY_APPLY),
                    help="comma list of apply paths, a row each: kernel (replica/kernels/), reference (torch) "
                         "(default: %(default)s)")
    rp.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/replay-TIME)")
    rp.add_argument("--json", action="store_true", help="print the results object (with a `rows` list)")
    rp.set_defaults(fn=replay)
    import hilo.ops.bench.probe as probe_bench
    from hilo.ops.bench.probe import ProbeConfig
    sc = bsub.add_parser("scrape",
                         help="/metrics latency (p50, p99, max) and lag consistency, scraped while a site catches up")
    sc.add_argument("--shape", choices=shapes, default="qwen3-0.6b", help="adapter shape (default: %(default)s)")
    sc.add_argument("--versions", type=at_least(1), default=60,
                    help="versions the site catches up (default: %(default)s)")
    sc.add_argument("--every-ms", type=float, default=50.0, help="scrape interval (default: %(default)s, 20 a second)")
    sc.add_argument("--json", action="store_true", help="print the JSON row")
    sc.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/scrape-TIME)")
    sc.set_defaults(fn=scrape)
    sn = bsub.add_parser("snapshot",
                         help="a site's snapshot: save and load seconds and bytes per format (raw, msgpack + "
                         "zstd, raw through zstd) and the apply loop's stall per background snapshot")
    sn.add_argument("--shape", choices=shapes, default="qwen3-1.7b", help="adapter shape (default: %(default)s)")
    sn.add_argument("--state", action="append", metavar="CODEC:N",
                    help="a state N versions in, made by CODEC (spar4 or dense); repeatable (default: spar4:30 and "
                         "dense:3)")
    sn.add_argument("--repeats", type=at_least(1), default=3,
                    help="saves and loads per format; medians (default: %(default)s)")
    sn.add_argument("--json", action="store_true", help="print the JSON")
    sn.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/snapshot-TIME)")
    sn.set_defaults(fn=snapshot)
    rk = bsub.add_parser("ranks",
                         help="a 2-rank trainer (torchrun, gloo) against a lone one at an adapter's shape: the job's "
                         "step, the publishing rank's, and the other rank's apply of the broadcast message")
    rk.add_argument("--shape", choices=shapes, default="qwen3-1.7b", help="adapter shape (default: %(default)s)")
    rk.add_argument("--codec", choices=sorted(CODECS), default="spar4", help="the run's codec (default: %(default)s)")
    rk.add_argument("--steps", type=at_least(1), default=5,
                    help="timed steps per job, after a warm-up (default: %(default)s)")
    rk.add_argument("--rounds", type=at_least(1), default=2,
                    help="each job this many times, alternating (default: %(default)s)")
    rk.add_argument("--ranks", default="1,2", metavar="N,N",
                    help="the jobs' rank counts, 1 first (default: %(default)s; ranks beyond the machine's cores share "
                         "them: the JSON says how many there were)")
    rk.add_argument("--json", action="store_true", help="print the JSON")
    rk.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/ranks-TIME)")
    rk.set_defaults(fn=ranks)
    tr = bsub.add_parser("trainer",
                         help="what a training step costs with hilo-sync against plain torch AdamW, in one table: "
                         "encode, apply, publish wait on the critical path, step; file log, Kafka and Kafka behind an "
                         "emulated RTT, in line and pipelined; 1 and 2 ranks")
    trainer_flags.add_arguments(tr)
    tr.set_defaults(fn=trainer)
    pr = bsub.add_parser("probe",
                         help="per block and version: is a compressed method's step the uncompressed shadow's? "
                         "(blocks sent, decoded rank, step cosine, residual)", description=probe_bench.__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    config_options(pr, ProbeConfig, ("task", "sync", "budget", "steps"))
    pr.add_argument("--optimizers", type=names(optimizers), default=",".join(ProbeConfig.optimizers),
                    help="comma list (default: %(default)s)")
    pr.add_argument("--lrs", type=lambda t: [float(x) for x in t.split(",")],
                    default=",".join(map(str, ProbeConfig.lrs)),
                    help="one learning rate per optimizer, comma list (default: %(default)s)")
    pr.add_argument("--seeds", type=lambda t: [int(x) for x in t.split(",")],
                    default=",".join(map(str, ProbeConfig.seeds)),
                    help="val-split seeds, comma list (default: %(default)s)")
    pr.add_argument("--out", metavar="DIR", help="folder for probe-TASK-SYNC.json")
    pr.add_argument("--json", action="store_true", help="print the results object")
    pr.set_defaults(fn=probe)
    from hilo.ops.bench.pace import PaceConfig
    pc = bsub.add_parser("pace",
                         help="one `hilo consume` process following a run that gains a version every second: versions "
                         "behind, freshness p50/p99, the snapshots' stall",
                         description="The versions are encoded beforehand "
                         "(their encode time reported on its own), then appended on schedule to a fresh log that one "
                         "apply-only site follows at the default snapshot cadence (ops/bench/pace.py).")
    config_options(pc, PaceConfig, ("shape", "optimizer", "versions", "interval_s", "log", "ready_s"),
                   flags={"interval_s": "--interval"})
    pc.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/pace-TIME)")
    pc.add_argument("--json", action="store_true", help="print the results object")
    pc.set_defaults(fn=pace)
    from hilo.ops.bench.fanout import FanoutConfig
    fo = bsub.add_parser("fanout",
                         help="1, 4, 16 apply-only sites on one cluster, and 16 split over a mirror: freshness "
                         "(publish to applied) and egress per version",
                         description="Per layout, a fresh run of the tiny "
                         "model followed by N `hilo consume` processes; with --mirror, MirrorMaker 2 "
                         "(ops/kafka/mirror.sh) fills the mirror and the largest N is split over both clusters "
                         "(ops/bench/fanout.py).")
    config_options(fo, FanoutConfig, ("log", "mirror", "versions", "interval_s", "ready_s"),
                   flags={"interval_s": "--interval"})
    fo.add_argument("--sites", type=lambda t: [int(x) for x in t.split(",")],
                    default=",".join(map(str, FanoutConfig.sites)),
                    help="comma list of site counts on the source (default: %(default)s)")
    fo.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/fanout-TIME)")
    fo.add_argument("--json", action="store_true", help="print the results object (with a `rows` list)")
    fo.set_defaults(fn=fanout)
    r = bsub.add_parser("rl",
                        help="GRPO across sites: synchronous (S = 0) against S = 1, 2, 4 on paired seeds: reward, "
                        "wall time, idle, staleness",
                        description="Reward against step and wall time, trainer idle fraction, "
                        "staleness, publish-to-serving latency, mismatch KL and bytes per version, for each staleness "
                        "bound S on paired seeds (ops/bench/rl.py). ops/rl.sh bench starts a vLLM server on the "
                        "student base and runs it.")
    config_options(r, BenchConfig,
                   ("vllm", "base", "seeds", "steps", "sites", "batch_prompts", "samples", "lr", "audit_share"))
    r.add_argument("--staleness", type=lambda t: [int(x) for x in t.split(",")],
                   default=",".join(map(str, BenchConfig.staleness)),
                   help="comma list of S; the first is the reference (default: %(default)s)")
    r.add_argument("--quick", action="store_true",
                   help="smoke run, what CI runs: S = 0 and 2, 1 seed, 3 steps of 2 groups of "
                   "2 (instead of the options above)")
    r.add_argument("--out", metavar="DIR", help="results folder; an existing one resumes its saved runs "
                   "(default: ~/.cache/hilo-sync/bench/rl-TIME)")
    r.add_argument("--json", action="store_true", help="print the results object (with `rows` per S and `runs`)")
    r.set_defaults(fn=rl)
    from hilo.ops.bench.audit import AuditBenchConfig
    from hilo.schemas import options
    au = bsub.add_parser("audit", help="the trainer's audit on honest GRPO runs: per-token log-probability differences "
                         "(the tolerance's calibration) and the trainer's time per step at each audited share",
                         description="One `hilo rl` run per audited share (0, 10%, 100%), 2 honest sites on a vLLM "
                         "server with fp32 adapters (ops/bench/audit.py); with --served, the audit where sites serve: "
                         "per served dtype, honest noise, each liar's rollouts to quarantine, false quarantines over N "
                         "honest rollouts (ops/bench/audit_noise.py).")
    config_options(au, AuditBenchConfig,
                   ("vllm", "base", "steps", "batch_prompts", "samples", "seed", "honest", "liar"))
    au.add_argument("--served", type=lambda t: [x for x in t.split(",") if x], default="", metavar="URL=DTYPE,...",
                    help=options.help_of(AuditBenchConfig.__dataclass_fields__["served"]))
    au.add_argument("--shares", type=lambda t: [float(x) for x in t.split(",") if x],
                    default=",".join(map(str, AuditBenchConfig.shares)),
                    help="comma list of shares (default: %(default)s)")
    au.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/audit-TIME)")
    au.add_argument("--json", action="store_true", help="print the results object (with `rows` per share)")
    au.set_defaults(fn=audit)
