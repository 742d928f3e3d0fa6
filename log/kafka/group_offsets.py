"""Consumer-group offsets through kafka-python's admin API: a site's committed position (commit, committed) and the
run's groups. Apart from topic administration (admin.py), whose lazily connected client the reads share."""
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from hilo.log import retry

from .admin import RETRIABLE_TRIES, retrying
from .errors import failure, is_retriable

COMMIT_TIMEOUT_MS = 5_000  # one commit request: a frozen coordinator holds a commit this long at most
# one commit, retries included; past it the caller backs off and tries again (group_commit.py)
COMMIT_WITHIN_S = 10.0


class GroupOffsets:
    """The consumer-group offsets of the cluster `admin` (an admin.Admin) reaches: commits on a client of their own,
    reads and listings on the admin's."""

    def __init__(self, admin):
        self.admin, self.connector, self.timeout_ms = admin, admin.connector, admin.timeout_ms
        self.url = admin.url
        self._committer = None  # the commits' own client, replaced after a failed commit

    def commit(self, group, topic, offset, metadata) -> None:
        """Commit a group offset through the admin API (the group has no live members), on a client of its own whose
        requests are bounded by COMMIT_TIMEOUT_MS and the whole commit by COMMIT_WITHIN_S. A failed commit replaces that
        client: kafka-python caches a group's coordinator and never forgets it, so after the coordinator moved (or froze
        and came back) the old client asked the old node again and again (NotCoordinatorError for minutes)."""
        def attempt():
            if self._committer is None:
                self._committer = self.connector.connect(
                    KafkaAdminClient, request_timeout_ms=min(self.timeout_ms, COMMIT_TIMEOUT_MS),
                    bootstrap_timeout_ms=self.connector.connect_timeout_ms, client_id="hilo-commit")
            res = self._committer.alter_group_offsets(
                group, {TopicPartition(topic, 0): OffsetAndMetadata(offset, metadata, -1)})
            err = next(iter(res.values()))
            if getattr(err, "errno", 0):
                raise err()  # reported per partition, not raised: raise it so a coordinator still loading is retried
        self.connector.check()
        try:
            retry.call(attempt, retriable=is_retriable, attempts=RETRIABLE_TRIES, within_s=COMMIT_WITHIN_S)
        except KafkaError as e:
            self._drop_committer()  # the next commit connects afresh and finds the group's coordinator again
            raise failure(f"{self.url}: committing group {group!r} at {topic}@{offset}", e) from None

    def _drop_committer(self) -> None:
        client, self._committer = self._committer, None
        if client is not None:
            client.close()

    def committed(self, group, topic):
        """(offset, metadata) or None."""
        res = retrying(f"fetch offsets of {group}", self.admin.client.list_group_offsets, {group: None})
        om = res.get(group, {}).get(TopicPartition(topic, 0))
        return None if om is None or om.offset < 0 else (om.offset, om.metadata)

    def groups(self, prefix) -> list:
        """Consumer groups whose id starts with `prefix`."""
        return sorted(g["group_id"] for g in retrying("list groups", self.admin.client.list_groups)
                      if g["group_id"].startswith(prefix))

    def close(self) -> None:
        """Close the commits' client (the admin's is the admin's to close)."""
        self._drop_committer()
