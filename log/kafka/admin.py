"""Topics, their configs and DeleteRecords, through kafka-python's admin client (consumer-group offsets: their own
part, group_offsets.py, which shares this client)."""
import time

from kafka import TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.errors import KafkaError, TopicAlreadyExistsError, UnknownTopicOrPartitionError

from hilo.log import retry
from hilo.log.base import check_run, checkpoints_topic, prompts_topic, rollouts_topic, updates_topic
from hilo.schemas.errors import ConfigError, LogError, NoSuchTopic

from .errors import failure, from_code, is_retriable

RETRIABLE_TRIES = 20


def retrying(what: str, fn, *args, **kwargs):
    """fn(*args), retrying Kafka's retriable errors (a coordinator still starting, an election) with backoff;
    LogError naming `what` once it gives up or the error is not retriable."""
    try:
        return retry.call(lambda: fn(*args, **kwargs), retriable=is_retriable, attempts=RETRIABLE_TRIES)
    except KafkaError as e:
        raise failure(what, e) from None


class Admin:
    """The admin side of one KafkaLog: its topics and the cluster.

    connector: connection.Connector. timeout_ms: per request. record_bytes / chunk_bytes: the largest record this
    client writes (as the broker counts it) and its value.
    """

    def __init__(self, connector, timeout_ms: int, chunk_bytes: int, record_bytes: int):
        self.connector, self.timeout_ms = connector, timeout_ms
        self.chunk_bytes, self.record_bytes = chunk_bytes, record_bytes
        self.url = connector.url
        self._client = None

    @property
    def client(self) -> KafkaAdminClient:
        """Lazily connected kafka-python admin client."""
        self.connector.check()
        if self._client is None:
            self._client = self.connector.connect(KafkaAdminClient, request_timeout_ms=self.timeout_ms,
                                                  bootstrap_timeout_ms=self.connector.connect_timeout_ms,
                                                  client_id="hilo-admin")
        return self._client

    # -- topics ---------------------------------------------------------------------------------
    def create_topics(self, run, retention_ms=-1) -> list:
        """Create RUN.updates / RUN.checkpoints with one partition and delete retention; validate existing ones."""
        check_run(run)
        return self._create({updates_topic(run): 1, checkpoints_topic(run): 1}, retention_ms)

    def create_rollout_topics(self, run, prompt_partitions, retention_ms=-1) -> list:
        """Create RUN.prompts (P partitions) and RUN.rollouts (1) with delete retention; validate existing ones."""
        check_run(run)
        if prompt_partitions < 1:
            raise ConfigError(f"prompt_partitions = {prompt_partitions}: must be >= 1")
        return self._create({prompts_topic(run): prompt_partitions, rollouts_topic(run): 1}, retention_ms)

    def _create(self, partitions: dict, retention_ms) -> list:
        """Create each {topic: partitions} that is missing (replicated up to 3, delete policy), then check each."""
        created = []
        brokers = retrying("describe cluster", self.client.describe_cluster)["brokers"]
        replication = min(3, len(brokers))
        self._check_broker_limits(brokers)
        for t, n in partitions.items():
            spec = {t: {"num_partitions": n, "replication_factor": replication,
                        "configs": {"cleanup.policy": "delete", "retention.ms": str(retention_ms),
                                    "min.insync.replicas": str(max(1, replication - 1)),
                                    "max.message.bytes": str(max(1 << 20, self.record_bytes))}}}
            try:
                self.client.create_topics(spec, timeout_ms=self.timeout_ms, wait_for_metadata=True)
                created.append(t)
            except TopicAlreadyExistsError:
                pass
            except KafkaError as e:
                raise failure(f"{self.url}: creating topic {t!r}", e) from None
            self._await_topic(t)
            self.check_topic(t, n)
        return created

    def _await_topic(self, topic, timeout_s: float = 30.0):
        """Wait until the brokers we ask know a topic just created: on a fresh multi-node cluster the metadata of a
        new topic reaches the brokers one by one, and a describe answered by a late one says "does not exist"."""
        deadline, seen = time.monotonic() + timeout_s, 0
        while seen < 3:  # three answers in a row (the admin client spreads requests over the brokers)
            desc = retrying(f"describe topic {topic}", self.client.describe_topics, [topic])[0]
            seen = seen + 1 if desc["error_code"] == 0 else 0
            if seen < 3:
                if time.monotonic() >= deadline:
                    raise LogError(f"{self.url}: topic {topic!r} was created but the cluster does not show it after "
                                   f"{timeout_s:.0f}s")
                time.sleep(0.1)  # polling the cluster's metadata propagation; nothing of ours to synchronise with

    def _check_broker_limits(self, brokers):
        """Refuse a chunk size the brokers cannot take in one request (socket.request.max.bytes)."""
        for b in brokers:
            broker, cfg = b["broker_id"], self.configs(ConfigResourceType.BROKER, str(b["broker_id"]))
            cap = int(cfg["socket.request.max.bytes"]["value"])
            if self.record_bytes > cap:
                raise LogError(f"{self.url}: chunk_bytes {self.chunk_bytes} needs records of {self.record_bytes} "
                               f"bytes, but broker {broker} takes requests of at most {cap} bytes "
                               f"(socket.request.max.bytes; message.max.bytes is {cfg['message.max.bytes']['value']}); "
                               f"lower chunk_bytes")

    def configs(self, kind, name) -> dict:
        """A broker's or topic's configs; kafka-python returns an empty set for a resource this principal may not
        describe, which is reported as what it is."""
        what = "broker" if kind == ConfigResourceType.BROKER else "topic"
        res = retrying(f"describe configs of {what} {name}", self.client.describe_configs, [ConfigResource(kind, name)],
                       config_filter="all")
        cfg = res.get(what, {}).get(name)
        if not cfg:
            raise LogError(f"{self.url}: the cluster shows no configs of {what} {name!r}: this principal may not "
                           f"describe them (DESCRIBE_CONFIGS on the {'cluster' if what == 'broker' else 'topic'}; "
                           f"`hilo acls grant` gives the trainer and sites theirs)")
        return cfg

    def partitions(self, topic) -> int:
        """How many partitions `topic` has (NoSuchTopic if it does not exist)."""
        return len(self._describe(topic)["partitions"])

    def _describe(self, topic) -> dict:
        desc = retrying(f"describe topic {topic}", self.client.describe_topics, [topic])[0]
        if desc["error_code"]:
            error = from_code(desc["error_code"])
            if isinstance(error, UnknownTopicOrPartitionError):
                raise NoSuchTopic(f"{self.url}: topic {topic!r} does not exist (run `hilo topics create --log "
                                  f"{self.url} --run ...`)")
            raise failure(f"{self.url}: describing topic {topic!r}", error)
        return desc

    def check_topic(self, topic, partitions=1):
        """Exactly `partitions` partitions, cleanup.policy=delete and room for this client's records, or LogError saying
        what is wrong."""
        desc = self._describe(topic)
        if len(desc["partitions"]) != partitions:
            why = ("(Kafka orders records only within a partition)" if partitions == 1
                   else "(hilo topics create --prompt-partitions)")
            raise LogError(f"{self.url}: topic {topic!r} has {len(desc['partitions'])} partitions; hilo-sync needs "
                           f"exactly {partitions} {why}")
        cfg = self.configs(ConfigResourceType.TOPIC, topic)
        policy = cfg["cleanup.policy"]["value"]
        if "compact" in policy:
            raise LogError(f"{self.url}: topic {topic!r} has cleanup.policy={policy}; compaction would delete "
                           f"versions, use delete")
        room = int(cfg["max.message.bytes"]["value"])
        if room < self.record_bytes:
            raise LogError(f"{self.url}: topic {topic!r} takes records of at most {room} bytes (max.message.bytes), "
                           f"chunk_bytes {self.chunk_bytes} needs {self.record_bytes}; lower chunk_bytes or raise the "
                           f"topic's max.message.bytes")

    def topic_settings(self, topic) -> dict:
        """What an operator checks of a topic besides check_topic: its replication factor (the smallest over its
        partitions) and its min.insync.replicas, retention.ms and retention.bytes as the broker reports them."""
        desc, cfg = self._describe(topic), self.configs(ConfigResourceType.TOPIC, topic)
        return {"replication": min(len(p["replica_nodes"]) for p in desc["partitions"]),
                **{k: int(cfg[k]["value"]) for k in ("min.insync.replicas", "retention.ms", "retention.bytes")}}

    def authorized(self, topic=None) -> set:
        """The operations this principal may do on `topic` (or, without one, on the cluster), as the broker computes
        them from its ACLs: implied ones included (READ gives DESCRIBE), every one where no authorizer runs."""
        if topic is None:
            return set(retrying("describe cluster", self.client.describe_cluster).get("authorized_operations") or ())
        return set(retrying(f"describe topic {topic}", self.client.describe_topics,
                            [topic])[0].get("authorized_operations") or ())

    def cluster(self) -> dict:
        """The cluster's id, controller and brokers."""
        return retrying("describe cluster", self.client.describe_cluster)

    def retention(self, topic) -> dict:
        """The topic's retention.ms and retention.bytes as the broker reports them."""
        cfg = self.configs(ConfigResourceType.TOPIC, topic)
        return {k: cfg[k]["value"] for k in ("retention.ms", "retention.bytes")}

    def trim(self, topic, before) -> bool:
        """DeleteRecords up to `before`: the log start moves exactly there, whatever the segment layout."""
        retrying(f"trimming {topic} before offset {before}", self.client.delete_records,
                 {TopicPartition(topic, 0): before})
        return True

    def runs(self) -> list:
        """Topics named RUN.updates on the cluster."""
        topics = retrying("list topics", self.client.list_topics)
        return sorted(t[: -len(".updates")] for t in topics if t.endswith(".updates"))

    def close(self) -> None:
        """Close the admin client."""
        if self._client is not None:
            self._client.close()
            self._client = None
