"""Kafka's prompt queue: the generating sites of a run are one consumer group on RUN.prompts, and a site settles a
batch (its rollouts and the group's offsets) in one transaction (consume-transform-produce, exactly once).

- Group `hilo.RUN.generate`: Kafka spreads the prompt partitions over the live sites and rebalances when one joins,
  leaves or stops heartbeating. Offsets are committed only inside a settle's transaction (no auto-commit).
- Transactional id `hilo.RUN.generate.SITE`: a restarted site fences its own zombie (whose open transaction is
  aborted). The offsets go with the consumer's group metadata (generation and member id, KIP-447), so a site
  whose partitions were moved to another site cannot commit: its transaction fails and is aborted, and it
  rewinds to the group's committed offsets (its membership: joining, rewinding, rejoining, prompt_member.py).
- Reads are read_committed: a prompt the trainer's aborted transaction wrote is never answered.
"""
from kafka import KafkaProducer, OffsetAndMetadata, TopicPartition
from kafka.errors import CommitFailedError, FencedInstanceIdError, KafkaError

from hilo.schemas import crash_points
from hilo.log.base import prompts_topic, rollouts_topic
from hilo.log.prompt_queue import Lease, PromptQueue, generate_group
from hilo.schemas.chunks import Record
from hilo.schemas.errors import FencedError, LeaseLost

from .deadline import call_within
from .errors import failure, is_fenced, unwrap
# the group's timings are the member's; importable from here as before
from .prompt_member import MAX_POLL_INTERVAL_MS, SESSION_TIMEOUT_MS, STUCK_S, PromptGroupMember  # noqa: F401
from .writer import ABORT_TIMEOUT_S, ATTEMPT_TIMEOUT_S


class KafkaPromptQueue(PromptQueue):
    """Prompts of `run` for `site` on the cluster of `log` (a KafkaLog)."""

    def __init__(self, log, run: str, site: str, partitions: int | None = None):
        self.log, self.run, self.site = log, run, site
        self.prompts, self.rollouts = prompts_topic(run), rollouts_topic(run)
        log.check_topic(self.rollouts)
        self.group = generate_group(run)
        self.member = PromptGroupMember(log, self.group, self.prompts, site)  # joins, rewinds and rejoins the group
        self._producer = None

    @property
    def consumer(self):
        """The group member's consumer: None from leaving the group (an outage) until the next take joins again."""
        return self.member.consumer

    @property
    def producer(self) -> KafkaProducer:
        """The site's transactional producer (its init fences an earlier incarnation of this site)."""
        if self._producer is None:
            p = self.log.connector.connect(
                KafkaProducer, acks="all", enable_idempotence=True, linger_ms=0,
                transactional_id=f"{self.group}.{self.site}",
                max_block_ms=int(ATTEMPT_TIMEOUT_S * 1000), retry_backoff_ms=10, client_id=f"hilo-generate-{self.site}")
            try:
                p.init_transactions()
            except KafkaError as e:
                p.close(timeout=0)
                raise failure(f"{self.log.url}: site {self.site}: joining run {self.run}'s generating sites",
                              e) from None
            self._producer = p
        return self._producer

    def take(self, max_prompts, timeout_s=1.0):
        """One poll of the group's partitions assigned to this site."""
        self.producer  # noqa: B018  (fence a zombie of this site before reading anything)
        try:
            if self.consumer is None:  # a rejoin that met an outage: join now
                self.member.join()
            got = self.consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_prompts)
        except KafkaError as e:  # a broker restart: kafka-python raises a connection error from the coordinator lookup
            raise failure(f"{self.log.url}: site {self.site}: reading run {self.run}'s prompts", e) from None
        # idle: nothing came and no partition is paused (a paused one waits for a version, not stuck)
        self.member.watch(idle=not any(got.values()) and not self.consumer.paused())
        records, nxt, sources = [], {}, []
        for tp, recs in got.items():
            for r in recs:
                records.append(Record(r.offset, r.key, r.value,
                                      {k: v.decode() for k, v in (r.headers or [])}))
                sources.append(tp.partition)
                nxt[tp.partition] = r.offset + 1
        return Lease(records, None, nxt, sources)

    def defer(self, lease, later):
        """Rewind each partition to its first deferred record and pause it; the lease keeps what precedes it."""
        later = {id(r) for r in later}
        first = {}  # partition -> its first deferred offset
        for r, part in zip(lease.records, lease.sources):
            if id(r) in later:
                first[part] = min(first.get(part, r.offset), r.offset)
        kept = [(r, part) for r, part in zip(lease.records, lease.sources) if part not in first
                or r.offset < first[part]]
        nxt = {}
        for r, part in kept:
            nxt[part] = max(nxt.get(part, 0), r.offset + 1)
        for part, offset in first.items():
            tp = TopicPartition(self.prompts, part)
            self.consumer.seek(tp, offset)
            self.consumer.pause(tp)
        return Lease([r for r, _ in kept], None, nxt, [part for _, part in kept])

    def resume(self):
        """Unpause what `defer` paused (a rebalance unpauses on its own: the new owner reads from the committed
        offset)."""
        paused = self.consumer.paused() if self.consumer is not None else None
        if paused:
            self.consumer.resume(*paused)

    def settle(self, lease, records):
        """Rollouts and the group's offsets in one transaction; LeaseLost (and a rewind) if the group moved on."""
        if not lease.records:
            return []
        if self.consumer is None:  # this member left the group in an outage: its lease's prompts are read again
            raise LeaseLost(f"{self.log.url}: run {self.run}: site {self.site} rejoins the group after an outage; "
                            f"these {len(records)} rollouts are discarded and their prompts read again")
        p = self.producer
        offsets = {TopicPartition(self.prompts, part): OffsetAndMetadata(off, "", -1)
                   for part, off in lease.partitions.items()}
        try:
            p.begin_transaction()
            futures = [p.send(self.rollouts, value=v, key=k, partition=0,
                              headers=[(hk, hv.encode()) for hk, hv in h.items()])
                       for k, v, h in records]
            group = self.consumer.group_metadata()
            # bounded like the commit: kafka-python waits on the coordinator's answer with no timeout, and a site whose
            # settle met a broker restart waited there forever, silent (a stuck site's stack, test_outage's hilo rl run)
            call_within(lambda: p.send_offsets_to_transaction(offsets, group), ATTEMPT_TIMEOUT_S, on_abandon=self._drop)
            p.flush(timeout=ATTEMPT_TIMEOUT_S)
            crash_points.reach("generate.in-transaction")  # the rollouts are on the brokers, uncommitted
            call_within(p.commit_transaction, ATTEMPT_TIMEOUT_S, on_abandon=self._drop)
            return [f.get(timeout=ATTEMPT_TIMEOUT_S).offset for f in futures]
        except KafkaError as e:
            self._abort()
            self.member.rewind()
            if is_fenced(e):
                self._drop()
                raise FencedError(f"{self.log.url}: run {self.run}: site {self.site} was fenced by a newer process of "
                                  f"the same site (transactional id {self.group}.{self.site}); this one generates "
                                  f"nothing more") from None
            if isinstance(unwrap(e), (CommitFailedError, FencedInstanceIdError)):
                raise LeaseLost(f"{self.log.url}: run {self.run}: site {self.site}: the group moved prompts at "
                                f"{sorted(lease.partitions.items())} to another site before this one settled "
                                f"({type(unwrap(e)).__name__}); these {len(records)} rollouts are discarded") from None
            raise failure(f"{self.log.url}: site {self.site}: settling {len(lease)} prompts", e) from None

    def release(self, lease):
        """Rewind to the group's committed offsets: the lease's prompts are read again."""
        if lease.records:
            self.member.rewind()

    def _abort(self):
        if self._producer is None:
            return
        try:
            call_within(self._producer.abort_transaction, ABORT_TIMEOUT_S, on_abandon=self._drop)
        except KafkaError:  # a fresh producer's init aborts it instead
            self._drop()

    def _drop(self):
        if self._producer is not None:
            try:
                self._producer.close(timeout=0)
            except Exception:  # noqa: BLE001  (closing a broken client)
                pass
        self._producer = None

    def close(self):
        """Leave the group (its partitions go to the other sites at once) and close the producer."""
        try:
            self.member.close()
        finally:
            if self._producer is not None:
                self._producer.close(timeout=5)
                self._producer = None
