"""A generating site's member of its run's prompt group (prompt_group.py): joining the group, rewinding to the group's
committed offsets when a lease is given back, and rejoining with a fresh consumer when those offsets cannot be read
(an outage) or the member is stuck.
"""
import logging
import time

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from hilo.schemas.errors import LogError

from .errors import unwrap
from .writer import ATTEMPT_TIMEOUT_S

logger = logging.getLogger(__name__)
SESSION_TIMEOUT_MS = 10_000   # a site silent this long (dead, SIGSTOPped) loses its partitions to the others
MAX_POLL_INTERVAL_MS = 300_000  # the longest one batch's generation may take before the group moves its prompts
STUCK_S = 30.0  # no prompt for this long while the backlog does not move: the member is stuck (see watch)


class PromptGroupMember:
    """Site `site`'s member of consumer group `group` on topic `prompts` of `log` (a KafkaLog). `consumer`: the
    group member now, None from leaving the group until the next `join`."""

    def __init__(self, log, group: str, prompts: str, site: str):
        self.log, self.group, self.prompts, self.site = log, group, prompts, site
        self.consumer = None
        self.join()
        self.idle_since, self.idle_backlog = time.monotonic(), None  # the stuck-member watchdog (watch)

    def join(self):
        """A fresh member of the group (a new consumer), subscribed to RUN.prompts."""
        log, site = self.log, self.site
        self.consumer = log.connector.connect(
            KafkaConsumer, group_id=self.group, enable_auto_commit=False, auto_offset_reset="earliest",
            isolation_level="read_committed", session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=SESSION_TIMEOUT_MS // 4,
            max_poll_interval_ms=MAX_POLL_INTERVAL_MS, client_id=f"hilo-generate-{site}",
            max_partition_fetch_bytes=4 << 20)
        self.consumer.subscribe([self.prompts])

    def watch(self, idle: bool):
        """After each poll; `idle`: it brought nothing and no partition is paused (a paused one waits for a version,
        not stuck). A member that gets nothing for STUCK_S while the group's backlog (prompts past its committed
        offsets) stays where it was is stuck: nobody answers. Seen here: kafka-python's member was removed by the
        coordinator (its heartbeats stopped) and never looked the coordinator up again, so it waited forever. A fresh
        consumer rejoins."""
        if not idle:
            self.idle_since, self.idle_backlog = time.monotonic(), None
            return
        if time.monotonic() - self.idle_since < STUCK_S:
            return
        backlog = self._backlog()
        if backlog and backlog == self.idle_backlog:
            self.rejoin(f"nothing from the prompt group for {time.monotonic() - self.idle_since:.0f} s while "
                        f"{sum(backlog.values())} prompts wait unanswered")
        self.idle_since, self.idle_backlog = time.monotonic(), backlog

    def _backlog(self) -> dict:
        """{partition: offsets past the group's committed offset}, for the partitions where a prompt is past it, from
        the admin API and the log (not the group member)."""
        try:
            offsets = self.log.admin.list_group_offsets({self.group: None}).get(self.group, {})
            committed = {tp.partition: max(0, m.offset) for tp, m in offsets.items() if tp.topic == self.prompts}
            behind = {p: n for p in range(self.log.partitions(self.prompts))
                      if (n := self.log.end_offset(self.prompts, p) - committed.get(p, 0)) > 0}
            return self._holding_prompts(behind, committed) if behind else {}
        except (KafkaError, LogError):
            return {}

    def _holding_prompts(self, behind: dict, committed: dict) -> dict:
        """The partitions of `behind` with a prompt past the committed offset. The trainer appends prompts in
        transactions, and each one's commit marker takes an offset no reader gets: counted by offsets alone, an idle
        site saw one prompt per partition "wait unanswered" after every batch and rejoined the group every STUCK_S.
        So the range is read (read_committed, with a consumer of its own, outside the group)."""
        consumer = self.log.connector.connect(KafkaConsumer, enable_auto_commit=False, auto_offset_reset="earliest",
                                              isolation_level="read_committed", client_id=f"hilo-backlog-{self.site}")
        try:
            tps = {TopicPartition(self.prompts, p): committed.get(p, 0) + n for p, n in behind.items()}  # tp: end
            consumer.assign(list(tps))
            for tp in tps:
                consumer.seek(tp, committed.get(tp.partition, 0))
            found, deadline = set(), time.monotonic() + ATTEMPT_TIMEOUT_S
            while time.monotonic() < deadline:
                found |= {tp.partition for tp, records in consumer.poll(timeout_ms=500).items() if records}
                if all(tp.partition in found or consumer.position(tp, timeout_ms=5000) >= end
                       for tp, end in tps.items()):
                    break  # each partition: a prompt found, or read to its end (markers only)
            return {p: n for p, n in behind.items() if p in found}
        finally:
            consumer.close(autocommit=False)

    def rewind(self):
        """Seek every assigned partition back to the group's committed offset (the unsettled prompts come again). Where
        the offsets cannot be read (an outage), a fresh member: it starts from the group's committed offsets."""
        if self.consumer is None:  # not a member now: the next take joins and reads from the committed offsets
            return
        try:
            for tp in self.consumer.assignment():
                # bounded: kafka-python's committed() without a timeout waited for the coordinator forever, and a site
                # whose settle failed in a broker restart stopped there, silent, long after the broker was back
                committed = self.consumer.committed(tp, timeout_ms=int(ATTEMPT_TIMEOUT_S * 1000))
                if committed is None:
                    self.consumer.seek_to_beginning(tp)  # the group never committed here: its first prompt
                else:
                    self.consumer.seek(tp, committed)
        except KafkaError as e:
            self.rejoin(f"the group's offsets cannot be read ({type(unwrap(e)).__name__})")

    def rejoin(self, why: str):
        """Leave the group (bounded); the next take joins it again with a fresh consumer, which reads from the committed
        offsets. Joining there, not here, means a join that meets an outage is waited out like any read, and the site
        never keeps a closed consumer (whose next poll raised IllegalStateError and ended the site: test_outage's
        hilo rl run, a rewind during a broker restart)."""
        logger.warning("site %s: %s; rejoining the group with a fresh consumer", self.site, why)
        consumer, self.consumer = self.consumer, None
        try:
            consumer.close(autocommit=False, timeout_ms=5000)
        except Exception:  # noqa: BLE001  (closing a wedged client; nothing to report)
            pass

    def close(self):
        """Leave the group: its partitions go to the other sites at once."""
        if self.consumer is not None:
            self.consumer.close(autocommit=False)
