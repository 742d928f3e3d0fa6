"""The log's checks: the Kafka client file parses, the broker answers with it, the run's topics have the settings
hilo-sync needs (one partition where order matters, delete policy, room for a chunk, replication it can survive)."""
import os

from hilo.log import checkpoints_topic, prompts_topic, rollouts_topic, updates_topic
from hilo.log.kafka_config import check_kafka_config, client_config
from hilo.schemas.errors import ConfigError, HiloError, NoSuchTopic

from .base import fail, ok, warn

# (topic of a run, partitions it must have (None: any), whether every run has it: the return path's are optional)
RUN_TOPICS = ((updates_topic, 1, True), (checkpoints_topic, 1, True), (prompts_topic, None, False),
              (rollouts_topic, 1, False))
CONFIG_FIX = "edit the file: it takes the Java client's keys (docs/operations.md, \"Deploying across sites\")"


def kafka_config(s) -> list:
    """--kafka-config parses (known keys, readable files, complete SASL settings) and --log is a Kafka log to use it
    on."""
    c = s.config
    try:
        if c.log is not None:
            check_kafka_config(c.log, c.kafka_config)
        settings = client_config(c.kafka_config)
    except ConfigError as e:
        return [fail("kafka-config", str(e), CONFIG_FIX)]
    return [ok("kafka-config", f"{c.kafka_config}: {settings}")]


def reach(s) -> list:
    """The broker answers with --kafka-config's settings; or the embedded log's directory exists."""
    c = s.config
    if c.log.startswith("file://"):
        root = c.log[len("file://"):]
        if not os.path.isdir(root):
            return [fail("log", f"{c.log}: no such directory",
                         "check --log; the trainer (or `hilo topics create`) creates it")]
        return [ok("log", f"embedded file log at {root}: {len(s.log().runs())} run(s)")]
    if not s.kafka:
        return [fail("log", f"--log {c.log!r}: expected file://DIR or kafka://HOST:PORT[,HOST:PORT]", "fix --log")]
    try:
        cluster = s.log().admin_side.cluster()
    except HiloError as e:
        return [fail("log", str(e), "check --log's HOST:PORT, that a broker listens there, and that --kafka-config's "
                                    "security.protocol is the listener's")]
    return [ok("log",
               f"{c.log} answers as {client_config(c.kafka_config)}: {len(cluster['brokers'])} broker(s), controller "
               f"{cluster['controller_id']}, cluster id {cluster['cluster_id']}")]


def topics(s) -> list:
    """Each of the run's topics: one line with its partitions, policy, room for a chunk and (Kafka) replication and
    retention."""
    c, log, out = s.config, s.log(), []
    for topic_of, partitions, required in RUN_TOPICS:
        topic = topic_of(c.run)
        try:
            has = log.partitions(topic)
            if partitions is not None and has != partitions:
                out.append(fail("topics",
                                f"{topic}: {has} partitions; hilo-sync needs exactly {partitions} (Kafka orders "
                                f"records only within a partition)",
                                f"partitions cannot be removed: delete the topic (kafka-topics.sh --delete --topic "
                                f"{topic}; its records go with it) and run `hilo topics create --log {c.log} --run "
                                f"{c.run}`"))
                continue
            log.check_topic(topic, has)
        except NoSuchTopic:
            if required:
                out.append(fail("topics", f"{topic} does not exist",
                                f"hilo topics create --log {c.log} --run {c.run} (the "
                                f"trainer also creates it when it starts)"))
            continue
        except HiloError as e:  # compacted, too small for a chunk, not described: the message says which and what to do
            out.append(fail("topics", str(e)))
            continue
        out.append(settings(log, topic, has) if s.kafka
                   else ok("topics", f"{topic}: exists (the embedded log keeps everything)"))
    return out


def settings(log, topic: str, partitions: int):
    """Replication factor against min.insync.replicas, and retention, of one Kafka topic checked by check_topic."""
    st = log.admin_side.topic_settings(topic)
    rf, isr, keep = st["replication"], st["min.insync.replicas"], _retention(st)
    found = f"{topic}: {partitions} partition{'s' if partitions > 1 else ''}, delete policy, replication {rf}, " \
            f"min.insync.replicas {isr}, retention {keep}"
    alter = f"kafka-configs.sh --alter --entity-type topics --entity-name {topic} --add-config"
    if isr > rf:
        return fail("topics",
                    f"{found}: more in-sync replicas required than copies exist, so the broker refuses every write "
                    f"(NOT_ENOUGH_REPLICAS)", f"{alter} min.insync.replicas={max(1, rf - 1)}")
    issues = []
    if rf == 1:
        issues.append(("one copy: losing its broker loses the run's history",
                       "on a cluster of 3 brokers `hilo topics create` "
                       "replicates 3 times"))
    elif isr == rf:
        issues.append(("one broker down stops the trainer's writes", f"{alter} min.insync.replicas={rf - 1}"))
    elif isr == 1:
        issues.append(("an acknowledged version may live on one broker only", f"{alter} min.insync.replicas={rf - 1}"))
    if topic.endswith(".checkpoints") and keep != "forever":
        issues.append(("checkpoints expire: after a longer stop of the trainer no site can join",
                       f"{alter} retention.ms=-1,retention.bytes=-1 (the trainer deletes old checkpoints itself)"))
    if not issues:
        return ok("topics", found)
    return warn("topics", f"{found}: " + "; ".join(why for why, _ in issues), "; ".join(fix for _, fix in issues))


def _retention(st: dict) -> str:
    """'forever', or what deletes records first."""
    ms, size = st["retention.ms"], st["retention.bytes"]
    parts = ([f"{ms / 3.6e6:g} h"] if ms >= 0 else []) + ([f"{size / 1e9:g} GB"] if size >= 0 else [])
    return " or ".join(parts) if parts else "forever"

