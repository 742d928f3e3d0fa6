"""Histories, Jepsen style: every replica records (version, digest, offset) as it applies; a checker compares them.

A site (SiteConfig.history) and the trainer (ProducerConfig.history) append one JSON line per applied or
published version, flushed before the next. Each process start opens a session with a "start" line: the
version it starts from (a snapshot, a checkpoint or genesis), whose digest must be the trainer's too; after
it, versions must follow each other by exactly one. Replaying versions after a crash is a new session, so
it is allowed. `check` asserts every site's history is a prefix of the trainer's: no gap, no duplicate
within a session, no fork (a digest that differs from the trainer's at that version), and no version that
the trainer never acknowledged; and that no version the trainer acknowledged is missing from the log.
"""
import json
import os
import time
from dataclasses import dataclass, field

from hilo.schemas.chunks import Reassembler
from hilo.schemas.errors import HiloError

from hilo.log.base import prompts_topic, rollouts_topic, updates_topic
from hilo.log.tail import records


class HistoryWriter:
    """Appends (version, digest, offset) lines to a file, one session per process start."""

    def __init__(self, path: str):
        self.path = path
        self.session = f"{os.getpid()}-{os.urandom(4).hex()}"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._f = open(path, "a", encoding="utf-8")

    def record(self, version: int, digest: bytes, offset: int, start: bool = False, **extra) -> None:
        """One applied version (or, with `start`, the state a session starts from), stamped with the wall time "t";
        `extra` adds fields (a site: "w" when the log wrote it, "b" the record bytes it read, "a" seconds to verify,
        decode and apply it). Flushed so a SIGKILL
        right after loses nothing already recorded."""
        entry = ({"s": self.session, "v": version, "d": digest.hex(), "o": offset, "t": round(time.time(), 4)}
                 | ({"start": True} if start else {}) | extra)
        self._f.write(json.dumps(entry) + "\n")
        self._f.flush()

    def applied(self, applied) -> None:
        """A version a follower applied (its Applied): when the log wrote it, its record bytes, the work it took."""
        work = sum(applied.timing.get(k, 0.0) for k in ("verify", "decode", "apply"))
        self.record(applied.version, applied.digest, applied.last_offset, w=applied.written_at, b=applied.record_bytes,
                    a=round(work, 5))

    def notes(self, lines: list) -> None:
        """Lines that are not versions (no "v": checkers pass them by), stamped with the session and wall time: what
        the site's snapshots cost, for benchmarks."""
        for fields in lines:
            self._f.write(json.dumps({"s": self.session} | fields | {"t": round(time.time(), 4)}) + "\n")
        self._f.flush()

    def skip(self, offset: int, reason: str) -> None:
        """A record skipped as not a valid message of the run (no version: the replica did not move)."""
        self._f.write(json.dumps({"s": self.session, "skip": offset, "reason": reason}) + "\n")
        self._f.flush()

    def close(self) -> None:
        """Close the file."""
        self._f.close()


def read_history(path: str) -> list:
    """The entries of a history file, in order; a torn last line (a kill mid-write) is dropped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                if line.endswith("\n"):
                    raise
    return out


@dataclass
class Report:
    """What the checker found: counts, and every anomaly as one line."""

    sites: dict = field(default_factory=dict)      # site -> {"entries", "sessions", "last_version"}
    trainer_versions: int = 0
    anomalies: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No anomaly."""
        return not self.anomalies

    def summary(self) -> str:
        """One line per site and a verdict, for a fault test's output."""
        rows = [f"  {s}: {d['entries']} applies in {d['sessions']} sessions, up to v{d['last_version']}"
                for s, d in self.sites.items()]
        verdict = "OK: every history is a prefix of the trainer's" if self.ok else \
            f"{len(self.anomalies)} ANOMALIES:\n    " + "\n    ".join(self.anomalies[:20])
        return f"history check over {self.trainer_versions} trainer versions:\n" + "\n".join(rows) + f"\n  {verdict}"


def _sessions(entries):
    """Split entries into consecutive runs of one session."""
    out = []
    for e in entries:
        if not out or out[-1][0] != e["s"]:
            out.append((e["s"], []))
        out[-1][1].append(e)
    return out


def check(trainer: list, sites: dict, log_versions: dict | None = None) -> Report:
    """Check site histories ({name: entries}) against the trainer's entries (and, if given, the log's
    {version: digest} read by a fresh reader: every acknowledged version must be there, unchanged)."""
    rep = Report()
    trainer = [e for e in trainer if "v" in e]  # skip entries record refusals, not versions
    sites = {name: [e for e in entries if "v" in e] for name, entries in sites.items()}
    truth = {}
    for e in trainer:
        if e["v"] in truth and truth[e["v"]] != e["d"]:
            rep.anomalies.append(f"trainer: v{e['v']} acknowledged twice with different digests ({truth[e['v']][:12]}, "
                                 f"{e['d'][:12]})")
        truth[e["v"]] = e["d"]
    for _, run in _sessions(trainer):  # a restarted trainer's start may repeat versions; within a session, +1 each
        for a, b in zip(run, run[1:]):
            if b["v"] != a["v"] + 1:
                rep.anomalies.append(f"trainer: v{a['v']} then v{b['v']} in one session")
    rep.trainer_versions = len(truth)
    if log_versions is not None:  # what the trainer published (a start is a state it resumed from, not a publish)
        for v, d in sorted({e["v"]: e["d"] for e in trainer if not e.get("start")}.items()):
            if log_versions.get(v) != d:
                how = "missing" if v not in log_versions else "different"
                rep.anomalies.append(f"log: acknowledged v{v} ({d[:12]}) is {how} on the log")
    for name, entries in sites.items():
        sessions, last = _sessions(entries), None
        for session, run in sessions:
            if not run[0].get("start"):
                rep.anomalies.append(f"{name}: session {session} has no start entry")
            for a, b in zip(run, run[1:]):
                if b["v"] != a["v"] + 1:
                    rep.anomalies.append(f"{name}: v{a['v']} then v{b['v']} in session {session} "
                                         f"({'duplicate' if b['v'] <= a['v'] else 'gap'})")
            for e in run:
                if e["v"] not in truth:
                    rep.anomalies.append(f"{name}: {'started at' if e.get('start') else 'applied'} v{e['v']}, which "
                                         f"the trainer never acknowledged")
                elif truth[e["v"]] != e["d"]:
                    rep.anomalies.append(f"{name}: v{e['v']} digest {e['d'][:12]} != trainer's {truth[e['v']][:12]} "
                                         f"(fork)")
            last = run[-1]["v"] if last is None else max(last, run[-1]["v"])
        rep.sites[name] = {"entries": sum(not e.get("start") for e in entries), "sessions": len(sessions),
                           "last_version": last}
    return rep


def log_versions(log, run: str) -> dict:
    """{version: digest hex} of every update on the run's updates topic, read from its start by a fresh reader."""
    topic, out = updates_topic(run), {}
    r, pos, end = Reassembler(run, topic), log.begin_offset(updates_topic(run)), log.end_offset(updates_topic(run))
    while pos < end:
        batch = log.read(topic, pos, timeout_s=5.0)
        for rec in batch:
            try:
                msg = r.feed(rec)
            except HiloError:  # a record that is not a message of the run: no version of it
                continue
            if msg is not None and msg.kind == "update":
                out[msg.version] = msg.parsed.digest
        pos = max(pos, batch.next_offset)
    return out


def check_return_path(log, run: str) -> Report:
    """The return path's history, from the log alone: every prompt the trainer issued (all partitions of RUN.prompts)
    answered by exactly n rollouts, one per sample, none twice, none for a prompt never issued. Run it once the
    trainer has what it waited for (an unanswered prompt is an anomaly then: a lost prompt)."""
    from hilo.schemas.rollouts import PromptRecord, RolloutRecord, decode_rollout_record

    rep = Report()
    topic_p, topic_r = prompts_topic(run), rollouts_topic(run)
    wanted = {}
    for part in range(log.partitions(topic_p)):
        for rec in records(log, topic_p, part):
            p = decode_rollout_record(rec.value, f"{topic_p}[{part}] offset {rec.offset}")
            if isinstance(p, PromptRecord):
                if p.prompt_id in wanted:
                    rep.anomalies.append(f"prompt {p.prompt_id} issued twice")
                wanted[p.prompt_id] = p.sampling.n
    seen = {}
    for rec in records(log, topic_r):
        try:
            r = decode_rollout_record(rec.value, f"{topic_r} offset {rec.offset}")
        except HiloError:
            continue  # the trainer refuses and counts these; the history counts answers
        if isinstance(r, RolloutRecord) and r.run == run:
            seen.setdefault(r.prompt_id, []).append(r.sample)
    for pid, samples in seen.items():
        if pid not in wanted:
            rep.anomalies.append(f"rollouts for prompt {pid}, which was never issued")
        elif sorted(samples) != list(range(wanted[pid])):
            extra = sorted(s for s in set(samples) if samples.count(s) > 1)
            rep.anomalies.append(f"prompt {pid}: samples {sorted(samples)} of n = {wanted[pid]}" +
                                 (f" (duplicated: {extra})" if extra else " (incomplete)"))
    for pid in sorted(set(wanted) - set(seen)):
        rep.anomalies.append(f"prompt {pid}: no rollout (lost)")
    rep.sites = {"prompts": {"entries": len(wanted), "sessions": 0, "last_version": None},
                 "rollouts": {"entries": sum(map(len, seen.values())), "sessions": 0, "last_version": None}}
    return rep
