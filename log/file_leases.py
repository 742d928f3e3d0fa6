"""The embedded log's prompt queue: a lease per prompt, under the prompts topic's lock.

State: DIR/RUN.prompts/leases.json, replaced atomically, {"answered": [prompt offsets], "leases": {id: {"site",
"offsets", "until"}}, "scanned": RUN.rollouts offset reconciled up to}. The commit of a lease is its rollouts'
append (one write, tagged `hilo-lease: ID`): if a site dies between that append and the state file's update, the
next site to take the lock finds the tagged rollouts and marks the lease answered (roll forward), so the prompts
are never answered twice. A lease whose time ran out is taken over by the next site that asks; the stalled site's
settle then raises LeaseLost and appends nothing. A site that starts under a name drops the leases held under that
name (its previous incarnation's, as Kafka's transactional id fences a site's zombie), so a restarted site does not
wait out its own dead leases.
"""
import contextlib
import fcntl
import json
import os
import time
import uuid

from hilo.schemas import headers as H
from hilo.schemas.errors import LeaseLost

from hilo.schemas import crash_points
from .base import prompts_topic, rollouts_topic
from .prompt_queue import DEFAULT_LEASE_S, Lease, PromptQueue


class FilePromptQueue(PromptQueue):
    """Prompts of `run` on a FileLog, taken by `site` for `lease_s` seconds at a time."""

    def __init__(self, log, run: str, site: str, lease_s: float = DEFAULT_LEASE_S, clock=time.time):
        self.log, self.run, self.site, self.lease_s, self.clock = log, run, site, lease_s, clock
        self.prompts, self.rollouts = prompts_topic(run), rollouts_topic(run)
        log.check_topic(self.prompts)
        log.check_topic(self.rollouts)
        self.path = log.root / self.prompts / "leases.json"
        # a site restarted under its name fences its dead incarnation: its leases are free now
        with self._state() as st:
            mine = [lid for lid, lease in st["leases"].items() if lease["site"] == site]
            for lid in mine:
                del st["leases"][lid]

    @contextlib.contextmanager
    def _state(self):
        """The lease table under the prompts topic's lock, reconciled with the rollouts topic; saved on a clean exit."""
        with open(self.log.root / self.prompts / "records", "r+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            text = self.path.read_text() if self.path.exists() else '{"answered": [], "leases": {}, "scanned": 0}'
            st = json.loads(text)
            self._reconcile(st)
            yield st
            if json.dumps(st) == json.dumps(json.loads(text)):
                return  # unchanged (an idle site polling): no write, no fsync
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            with open(tmp, "w") as f:
                json.dump(st, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)

    def _reconcile(self, st):
        """Roll forward leases whose rollouts were appended by a site that died before updating the table."""
        while True:
            batch = self.log.read(self.rollouts, st["scanned"], timeout_s=0)
            for rec in batch:
                lease = st["leases"].pop(rec.headers.get(H.LEASE, ""), None)
                if lease is not None:
                    st["answered"].extend(lease["offsets"])
            if batch.next_offset == st["scanned"]:
                return
            st["scanned"] = batch.next_offset

    def take(self, max_prompts, timeout_s=1.0):
        """The oldest prompts that are neither answered nor held by a live lease (expired leases are taken over)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._state() as st:
                now = self.clock()
                held = {o for lease in st["leases"].values() if lease["until"] > now for o in lease["offsets"]}
                answered = set(st["answered"])
                end = self.log.end_offset(self.prompts)
                free = [o for o in range(end) if o not in answered and o not in held][:max_prompts]
                if free:
                    for lid, lease in list(st["leases"].items()):  # expired leases lose what is taken over from them
                        lease["offsets"] = [o for o in lease["offsets"] if o not in free]
                        if not lease["offsets"]:
                            del st["leases"][lid]
                    lid = f"{self.site}.{uuid.uuid4().hex[:16]}"
                    st["leases"][lid] = {"site": self.site, "offsets": free, "until": now + self.lease_s}
                    wanted = set(free)
                    records = [r for r in self.log.read(self.prompts, free[0], timeout_s=0, max_bytes=1 << 40)
                               if r.offset in wanted]
                    return Lease(records, lid)
            if time.monotonic() >= deadline:
                return Lease([], None)
            time.sleep(0.05)  # poll the file for the trainer's next prompts (another process)

    def settle(self, lease, records):
        """Append the rollouts tagged with the lease (one write: the commit), then mark its prompts answered."""
        if not lease.records:
            return []
        with self._state() as st:
            mine = st["leases"].get(lease.handle)
            want = sorted(r.offset for r in lease.records)
            if mine is None or sorted(mine["offsets"]) != want:
                raise LeaseLost(f"{self.log.url}: run {self.run}: site {self.site}: the lease on prompts at offsets "
                                f"{want} ran out and another site took them; these {len(records)} rollouts are "
                                f"discarded")
            offsets = self.log.append(self.rollouts, [(k, v, h | {H.LEASE: lease.handle}) for k, v, h in records])
            crash_points.reach("generate.in-transaction")  # appended (the commit), the table not yet updated
            del st["leases"][lease.handle]
            st["answered"].extend(want)
            st["scanned"] = offsets[-1] + 1 if offsets else st["scanned"]
            return offsets

    def release(self, lease):
        """Drop the lease: its prompts are free at once."""
        if lease.records:
            with self._state() as st:
                st["leases"].pop(lease.handle, None)

    def defer(self, lease, later):
        """Free the deferred prompts at once (any site may take them); the lease keeps the rest."""
        drop = {r.offset for r in later}
        kept = [r for r in lease.records if r.offset not in drop]
        with self._state() as st:
            mine = st["leases"].get(lease.handle)
            if mine is not None:
                mine["offsets"] = [o for o in mine["offsets"] if o not in drop]
                if not mine["offsets"]:
                    del st["leases"][lease.handle]
        return Lease(kept, lease.handle if kept else None)
