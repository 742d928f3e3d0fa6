"""The `hilo` subcommands as a table (pip's commands_dict): name -> (module, one-line summary).

`hilo --help` reads only this table; `hilo NAME ...` imports only hilo.ops.commands.NAME, whose
`register(subparsers)` builds that command's parser. So `hilo lag` never imports torch.
"""

COMMANDS = {
    "demo": ("demo", "trainer + 3 sites (one killed and restarted) on an embedded log; exit 0 if all match"),
    "topics": ("topics", "create and check a run's topics"),
    "acls": ("acls", "Kafka ACLs of a run on a secured cluster (--kafka-config of an admin)"),
    "keys": ("keys", "signing keys for a run"),
    "produce": ("produce", "run the built-in tiny trainer as a standalone producer"),
    "consume": ("consume", "follow a run at a rollout site: apply, export adapters, snapshot"),
    "rl": ("rl", "GRPO across sites on the digit task: this process trains, N generating sites answer through vLLM"),
    "lag": ("lag", "applied and serving version, lag in versions and bytes, offsets, age: one row per site"),
    "inspect": ("inspect", "one update's header fields and per-block rank/k and bytes"),
    "bench": ("bench", "benchmarks (JSON with --json)"),
    "doctor": ("doctor",
               "is this machine ready: Kafka client file, broker, a run's topics and ACLs, vLLM, kernels, CPU, disk"),
    "docs": ("docs", "write the generated docs pages (benchmark tables, metrics); --check fails on a stale one"),
}
