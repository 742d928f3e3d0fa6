"""Restoring the trainer's return path after a restart (RolloutExchange.restore): its state read back from the log.

Every prompt issued before the restart (all partitions of RUN.prompts) is trained or retired (per the rollout ledger,
up to the version the trainer restarted at), or in flight again; the rollouts already returned for those in flight are
read back from RUN.rollouts and offered again by the exchange's own rules (those of settled prompts are passed over
silently).
"""
import logging

from hilo.log.tail import records
from hilo.schemas.errors import HiloError
from hilo.schemas.rollouts import PromptRecord, decode_rollout_record

logger = logging.getLogger(__name__)


def unsettled_prompts(log, run: str, topic: str, partitions: int, settled: set) -> tuple:
    """(how many records `topic` holds over its `partitions`, and the prompts of `run` there not in `settled`, oldest
    issued first)."""
    issued, back = 0, []
    for part in range(partitions):
        for k, rec in enumerate(records(log, topic, part, start=0)):
            issued += 1
            try:
                p = decode_rollout_record(rec.value, f"{topic}[{part}] offset {rec.offset}")
            except HiloError:
                continue
            if isinstance(p, PromptRecord) and p.run == run and p.prompt_id not in settled:
                # issued in turn over the partitions: its place in issue order
                back.append((k * partitions + part, p))
    return issued, [p for _, p in sorted(back, key=lambda e: e[0])]


def restore(exchange, trainer_version: int) -> dict:
    """Rebuild `exchange` (a RolloutExchange, just opened) after a restart at `trainer_version`; returns what was
    rebuilt: {"trained", "retired", "in_flight", "rollouts"} (also left in `exchange.restored`)."""
    book, log, ledger, run = exchange.book, exchange.log, exchange.ledger, exchange.run
    trained, retired = ledger.settled(trainer_version) if ledger else (set(), set())
    book.done |= trained
    book.retired |= retired
    exchange._retired_recorded |= retired
    issued, back = unsettled_prompts(log, run, exchange.prompts, exchange.partitions, trained | retired)
    for p in back:  # oldest issued first, as the running trainer held them
        book.restore(p)
    exchange.issued = issued
    replayed, end = 0, log.end_offset(exchange.rollouts)
    for rec in records(log, exchange.rollouts, start=exchange.next_offset):
        end = max(end, rec.offset + 1)  # a read may run past the end asked for: never offer a record twice
        pid = rec.key.decode(errors="replace") if rec.key else ""
        if pid in book.in_flight:  # the key is the prompt id; the record itself is checked by poll's rules
            r = exchange._rollout(rec)
            if r is not None and r.prompt_id in book.in_flight and exchange._offer(rec, r, trainer_version) is None:
                replayed += 1
    exchange.next_offset = max(exchange.next_offset, end)
    exchange.restored = {"trained": len(trained), "retired": len(retired), "in_flight": len(book.in_flight),
                         "rollouts": replayed}
    logger.info("run %s: return path restored at v%d: %d prompts trained on, %d retired, %d in flight again with "
                "%d rollouts", run, trainer_version, *exchange.restored.values())
    return exchange.restored
