"""`hilo bench trainer`'s flags, defined once: the CLI's subcommand and the bench's own entry point (which its rank jobs
relaunch) parse the same ones."""
import argparse
import os

from hilo.ops.bench.delayed_broker import DEFAULT_PORT
from hilo.ops.commands.args import at_least
from hilo.replica.synthetic import QWEN3


def _ints(text: str) -> list:
    return [int(x) for x in text.split(",")]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The bench's public flags on `ap`."""
    ap.add_argument("--shape", choices=sorted(QWEN3), default="qwen3-1.7b", help="adapter shape (default: %(default)s)")
    ap.add_argument("--steps", type=at_least(1), default=5,
                    help="timed steps per job, after one warm-up (default: %(default)s)")
    ap.add_argument("--kafka", default=os.environ.get("HILO_KAFKA", "kafka://127.0.0.1:9092"),
                    help="the loopback broker (default: $HILO_KAFKA or %(default)s)")
    ap.add_argument("--rtt-ms", type=_ints, default=[],
                    help="comma list: also Kafka behind each emulated round trip, 1 rank in line and pipelined (a "
                    "broker of its own behind toxiproxy, ops/wan/toxiproxy.sh; no root needed; default: none)")
    ap.add_argument("--compute-s", type=float, default=0.0,
                    help="modelled forward + backward: every rank sleeps this long before each step(); a pipelined "
                    "publish hides the RTT only behind compute that exists (default: %(default)s)")
    ap.add_argument("--rows", type=lambda t: t.split(","),
                    help="comma list of jobs to run (adamw-1, file-1, file-1-pipelined, kafka-1, kafka-1-pipelined, "
                    "adamw-2, file-2, file-2-pipelined, kafka-2, kafka-2-pipelined, wan-1, wan-1-pipelined; a prefix "
                    "picks all it begins: kafka-1, wan; default: all)")
    ap.add_argument("--wan-port", type=at_least(1), default=DEFAULT_PORT,
                    help="the delayed broker's port; it takes the next three too (default: %(default)s)")
    ap.add_argument("--out", metavar="DIR", help="results folder (default: ~/.cache/hilo-sync/bench/trainer-TIME)")
    ap.add_argument("--json", action="store_true", help="print the JSON")
