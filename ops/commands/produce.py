"""`hilo produce`: the built-in tiny trainer as a standalone producer. Options come from ProducerConfig."""
from . import COMMANDS
from .args import at_least, budget, common, config_from_args, config_options, metrics_options, metrics_server

FIELDS = ("budget", "codec", "optimizer", "mode", "checkpoint_every", "state_dir", "signing_key", "history",
          "new_history",
          "on_bad_record", "publish_deadline_s", "pipeline")


def run(a):
    """Train --steps steps of the tiny model, publishing one version per step."""
    from hilo.ops.tiny_trainer import build_model, train
    from hilo.producer.config import ProducerConfig
    from hilo.producer.producer import HiLoProducer
    from hilo.schemas.metrics import Metrics
    cfg = config_from_args(ProducerConfig, a)
    metrics = Metrics("trainer", run=cfg.run)
    server = metrics_server(a, metrics.registry)  # bound before the trainer fences or publishes anything
    producer = HiLoProducer.open(build_model(seed=a.seed), cfg, metrics=metrics)
    if server:
        server.ready = lambda: ((False, "fenced by a newer trainer") if producer.fenced
                                else (True, f"v{producer.version}"))
    adapter = producer.manifest.adapter_bytes()

    def on_step(version, loss, compute_s, info):
        if "bytes" not in info:  # --pipeline: nothing settled yet (info is the last version the log acknowledged)
            return
        print(f"v{info['version']} loss {loss:.4f} bytes {info['bytes']} ({100 * info['bytes'] / adapter:.2f}% of "
              f"adapter) chunks {info['chunks']} compute {compute_s * 1e3:.0f} ms sync {info['total_s'] * 1e3:.0f} ms"
              + (f" lag {info['lag']:.2e}" if a.mode == "delta" else ""), flush=True)
    train(producer, a.steps, lr=a.lr, seed=a.seed, on_step=on_step)
    flushed = producer.flush()
    print(f"done: v{producer.version} digest {producer.replica.digest.hex()}"
          + (f" (flush: {flushed} message(s), lag {producer.lag():.2e})" if a.mode == "delta" else ""))
    producer.close()
    return 0


def register(sub):
    """The produce parser; codec, optimizer and mode choices come from their registries."""
    from hilo.producer.sync_mode import SYNC_MODES
    from hilo.producer.config import ProducerConfig
    from hilo.replay.bad_records import OnBadRecord
    from hilo.replica.codecs import CODECS
    from hilo.replica.optimizers import OPTIMIZERS
    p = sub.add_parser("produce", help=COMMANDS["produce"][1])
    common(p)
    config_options(p, ProducerConfig, FIELDS, types={"budget": budget},
                   choices={"codec": list(CODECS), "optimizer": list(OPTIMIZERS), "mode": list(SYNC_MODES),
                            "on_bad_record": [o.value for o in OnBadRecord]})
    metrics_options(p)
    p.add_argument("--steps", type=at_least(1), default=100, help="training steps to run (default: %(default)s)")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="model/data seed (default: %(default)s)")
    p.set_defaults(fn=run)
