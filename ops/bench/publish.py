"""`hilo bench publish`: what a transaction costs per version on Kafka (plain idempotent append vs transactional).

    hilo bench publish [--log kafka://127.0.0.1:9092] [--bytes 100000] [--rounds 6] [--json]

Both writers append one record of `--bytes` per version to a fresh run's updates topic, interleaved in
rounds of 8 (so machine noise hits both alike); reports the median milliseconds of each and their ratio.
"""
import os
import statistics
import time
import uuid

from hilo.log import open_log, updates_topic
from hilo.ops.bench.report import results_dir, save
from hilo.schemas import headers as H


def main(as_json: bool, url: str, size: int, rounds: int, out: str | None) -> int:
    """Run the benchmark and report."""
    run = f"publish-{uuid.uuid4().hex[:8]}"
    plain, txn = open_log(url), open_log(url)
    plain.create_topics(run)
    txn.become_writer(run, 0)  # transactional from here on, as a trainer is
    record = [(b"k", os.urandom(size), {H.RUN: run})]
    times = {"plain_ms": [], "transaction_ms": []}
    for _ in range(rounds):
        for name, log in (("plain_ms", plain), ("transaction_ms", txn)):
            for _ in range(8):
                t0 = time.perf_counter()
                log.append(updates_topic(run), record)
                times[name].append(time.perf_counter() - t0)
    res = {k: round(statistics.median(v) * 1e3, 2) for k, v in times.items()} \
        | {"bytes": size, "versions_each": 8 * rounds}
    res["ratio"] = round(res["transaction_ms"] / res["plain_ms"], 2)
    if not save(res, results_dir("publish", out), "publish", as_json):
        print(f"per version ({size} bytes): plain {res['plain_ms']} ms, in a transaction {res['transaction_ms']} ms "
              f"(x{res['ratio']})")
    return 0
