"""`hilo doctor` against the real broker (ops/kafka/start.sh) and this machine: a ready run passes, and each
misconfiguration it can meet FAILs on one line that names the fix (a closed port, a topic with 2 partitions, more
in-sync replicas required than copies, a client file with an unknown key or the wrong security protocol)."""
import json
import re
import socket
import subprocess
import sys

import pytest

from hilo.log import updates_topic
from hilo.ops.cli import main
from hilo.ops.doctor import CHECKS, NAMES
from hilo.ops.doctor.machine_checks import cpu_flags
from tests.conftest import KAFKA_URL, new_run
from tests.helpers import with_log

pytestmark = [pytest.mark.kafka]
QUICK = ["--skip", "kernels,cpu"]  # the machine's checks have their own test


def doctor(capsys, *args) -> tuple:
    """(exit code, {check: [(status, found, fix)]}) of `hilo doctor ARGS --json`, run in this process."""
    code = main(["doctor", *args, "--json"])
    rows = {}
    for r in json.loads(capsys.readouterr().out):
        rows.setdefault(r["check"], []).append((r["status"], r["found"], r["fix"]))
    return code, rows


def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening, then closed: nothing answers there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_ready_run_on_the_broker_passes_and_the_machine_is_described(capsys, tmp_path):
    run = new_run("doctor")
    assert main(["topics", "create", "--log", KAFKA_URL, "--run", run, "--retention-ms", "3600000"]) == 0
    capsys.readouterr()
    code, rows = doctor(capsys, "--log", KAFKA_URL, "--run", run, "--state-dir", str(tmp_path / "site"))
    # no --vllm, no --kafka-config
    assert code == 0 and list(rows) == ["log", "topics", "acls", "kernels", "cpu", "disk"]
    assert rows["log"][0][0] == "OK" and "1 broker(s)" in rows["log"][0][1]
    updates, checkpoints = rows["topics"]
    assert updates[1].startswith(f"{run}.updates: 1 partition, delete policy, replication 1, min.insync.replicas 1, "
                                 f"retention 1 h")
    # one broker: one copy, said as a WARN; checkpoints that expire after an hour: a WARN naming the config to change
    assert updates[0] == "WARN" and "one copy" in updates[1] and "checkpoints expire" not in updates[1]
    assert checkpoints[0] == "WARN" and "checkpoints expire" in checkpoints[1] and "retention.ms=-1" in checkpoints[2]
    assert rows["acls"] == [("OK", rows["acls"][0][1], "")] and "no authorizer" in rows["acls"][0][1]
    status, found, _ = rows["kernels"][0]
    assert status == "OK" and "one update's state equals the specification's" in found
    assert re.search(r"(compiled in|loaded from numba's cache in) [0-9.]+ s|already compiled", found)
    status, found, _ = rows["cpu"][0]
    flags = cpu_flags()
    assert status == ("OK" if {"avx2", "avx512f"} & flags else "WARN") and all(f in found
                                                                               for f in {"avx2", "avx512f"} & flags)
    assert rows["disk"][0][0] == "OK" and "GB free" in rows["disk"][0][1]
    code, rows = doctor(capsys, "--state-dir", str(tmp_path), "--min-free-gb", "1e9", *QUICK)  # more than any disk has
    assert code == 0 and rows["disk"][0][0] == "WARN" and "--min-free-gb" in rows["disk"][0][2]


def test_an_unreachable_broker_fails_and_the_checks_after_it_are_skipped(capsys):
    url = f"kafka://127.0.0.1:{closed_port()}"
    code, rows = doctor(capsys, "--log", url, "--run", "r", "--connect-timeout-s", "2", *QUICK)
    assert code == 1 and rows["log"][0][0] == "FAIL" and "cannot connect within 2s" in rows["log"][0][1]
    assert "HOST:PORT" in rows["log"][0][2]
    assert rows["topics"] == [("SKIP", "not checked: log failed", "")] and rows["acls"][0][0] == "SKIP"


def test_a_topic_with_two_partitions_fails_naming_the_fix(capsys):
    run = new_run("doctor2p")
    with_log(KAFKA_URL,
             lambda log: log.admin.create_topics({updates_topic(run): {"num_partitions": 2, "replication_factor": 1}}))
    code, rows = doctor(capsys, "--log", KAFKA_URL, "--run", run, *QUICK)
    updates, checkpoints = rows["topics"]
    assert code == 1 and updates[0] == "FAIL" and updates[1].startswith(f"{run}.updates: 2 partitions; hilo-sync needs "
                                                                        f"exactly 1")
    assert "delete the topic" in updates[2] and f"hilo topics create --log {KAFKA_URL} --run {run}" in updates[2]
    # made by hand: no checkpoints
    assert checkpoints[0] == "FAIL" and checkpoints[1] == f"{run}.checkpoints does not exist"


def test_more_in_sync_replicas_than_copies_fails(capsys):
    """min.insync.replicas 2 on a one-broker cluster: the broker takes the topic, then refuses every write
    (acks=all)."""
    run = new_run("doctorisr")
    assert main(["topics", "create", "--log", KAFKA_URL, "--run", run]) == 0
    capsys.readouterr()
    from kafka.admin import ConfigResource, ConfigResourceType
    with_log(KAFKA_URL,
             lambda log: log.admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, updates_topic(run),
                                                                            configs={"min.insync.replicas": "2"})]))
    code, rows = doctor(capsys, "--log", KAFKA_URL, "--run", run, *QUICK)
    status, found, fix = rows["topics"][0]
    assert code == 1 and status == "FAIL" and "NOT_ENOUGH_REPLICAS" in found and fix.endswith("min.insync.replicas=1")


@pytest.mark.parametrize("props, check, expect, fix", [
    ("security.protocol=PLAINTEXT\nsasl.kerberos.service.name=kafka\n", "kafka-config",
     r"unknown key 'sasl.kerberos.service.name'", "edit the file"),
    ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n", "kafka-config",
     r"SASL_PLAINTEXT needs sasl.username", "edit the file"),
    # a complete SASL file, but the broker's listener is plaintext: the handshake never completes
    ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=site\nsasl.password=wrong\n", "log",
     r"cannot connect within 3s", "security.protocol is the listener's"),
])
def test_a_bad_client_file_fails(capsys, tmp_path, props, check, expect, fix):
    conf = tmp_path / "client.properties"
    conf.write_text(props)
    code, rows = doctor(capsys, "--log", KAFKA_URL, "--run", "r", "--kafka-config", str(conf), "--connect-timeout-s",
                        "3", *QUICK)
    status, found, said = rows[check][0]
    assert code == 1 and status == "FAIL" and re.search(expect, found) and fix in said
    assert "wrong" not in json.dumps(rows)  # no secret in any line
    assert rows["topics"][0][0] == "SKIP"


def test_the_command_prints_one_line_per_check_and_exits_1_on_a_fail(tmp_path):
    p = subprocess.run([sys.executable, "-m", "hilo.ops.cli", "doctor", "--log", f"file://{tmp_path}/nowhere", "--run",
                        "r",
                        "--state-dir", str(tmp_path), "--skip", "kernels"], capture_output=True, text=True, timeout=300)
    lines = p.stdout.splitlines()
    cpu = "OK" if {"avx2", "avx512f"} & cpu_flags() else "WARN"
    assert p.returncode == 1 and [line.split()[:2] for line in lines] == [["FAIL", "log"], ["SKIP", "topics"],
                                                                          [cpu, "cpu"],
                                                                           # no ACLs on a file log
                                                                           ["OK", "disk"], ["OK", "disk"]]
    assert f"file://{tmp_path}/nowhere: no such directory; fix: check --log" in lines[0] and p.stderr == ""


def test_a_file_log_run_passes_and_the_registry_is_what_the_cli_offers(capsys, tmp_path):
    url = f"file://{tmp_path}/log"
    assert main(["topics", "create", "--log", url, "--run", "filerun"]) == 0
    capsys.readouterr()
    code, rows = doctor(capsys, "--log", url, "--run", "filerun", *QUICK)
    assert code == 0 and [s for s, _, _ in rows["topics"]] == ["OK", "OK"] and "acls" not in rows
    assert "1 run(s)" in rows["log"][0][1] and rows["disk"][0][1].startswith(f"file log {tmp_path}/log: ")
    assert NAMES == tuple(c.name for c in CHECKS) and len(set(NAMES)) == len(NAMES)
    with pytest.raises(SystemExit):  # a check name the registry lacks is refused by the parser
        main(["doctor", "--skip", "nosuch"])
