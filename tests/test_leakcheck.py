"""The suite's own cleanliness check (tests/leakcheck.py) finds what a test leaves behind, names where it started,
waits for what is already stopping, and stops the rest."""
import subprocess
import threading
import time

import pytest

from hilo.log import open_log
from tests.conftest import KAFKA_URL
from tests.leakcheck import State, leftovers


def test_a_thread_left_running_is_named_with_the_line_that_started_it():
    before = State.now()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="left-behind", daemon=True)
    t.start()
    try:
        lines = leftovers(before, grace_s=0.2)
    finally:
        stop.set()
        t.join()
    assert len(lines) == 1 and "thread 'left-behind'" in lines[0] and "tests/test_leakcheck.py:" in lines[0], lines


def test_a_thread_that_is_already_stopping_is_waited_for_not_reported():
    before = State.now()
    threading.Thread(target=time.sleep, args=(0.3,), name="stopping").start()
    assert leftovers(before, grace_s=10) == []


def test_a_child_process_left_running_is_named_and_killed():
    before = State.now()
    p = subprocess.Popen(["sleep", "60"])
    lines = leftovers(before, grace_s=0.2)
    assert len(lines) == 1 and f"process {p.pid}: sleep 60" in lines[0], lines
    assert p.wait(timeout=10) == -9


@pytest.mark.kafka
def test_an_open_kafka_client_is_named_and_closed():
    before = State.now()
    log = open_log(KAFKA_URL)
    log.runs()  # connects the admin client (and starts its I/O thread)
    client = log.admin
    lines = leftovers(before, grace_s=1)
    # its thread: said once
    assert len(lines) == 1 and "KafkaAdminClient client_id='hilo-admin' (not closed)" in lines[0], lines
    assert "tests/test_leakcheck.py:" in lines[0]
    assert client._closed
    log.close()
    assert leftovers(before, grace_s=10) == []  # its I/O thread stopped with it
