"""Out of space, as an operator meets it: each disk a small tmpfs (mounted here; the tests run as root), filled by the
test and grown again with `mount -o remount`. A site on the file log whose log disk is full keeps applying, says once
that its commit fails, and its committed position (`hilo lag`) is true again within one backoff of space returning; a
site or trainer whose state dir is full stops with one line naming the path, and a restart with space resumes at the
same digest with no temp snapshot left; the trainer waits out a full log disk and goes on when it has room again.
"""
import contextlib
import json
import os
import re
import signal
import subprocess

import pytest

from hilo.log import site_group, updates_topic
from hilo.log.filelog import FileLog
from hilo.log.tail import head
from hilo.producer.producer import HiLoProducer
from hilo.replay.snapshot import SnapshotStore
from hilo.schemas import headers as H
from hilo.schemas.errors import LogUnavailable, NoSuchTopic
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import held, hilo, reaped, wait_for_line, wait_until, with_log

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")
GROWN = "size=64m,nr_inodes=4096"


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, options) -> a folder with a tmpfs of its own under tmp_path; every one is unmounted after the
    test."""
    mounted = []

    def mount(name: str, options: str = "size=4m"):
        path = tmp_path / name
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
        mounted.append(path)
        return path
    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path, options: str) -> None:
    """Change a mounted tmpfs's size or inode count (grow it, or hold it where it is)."""
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True)


def fill(path) -> None:
    """Take every free byte of the filesystem at `path` with one file (a disk an operator finds full)."""
    with open(path / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * (64 << 10))
    with open(path / "filler", "ab", buffering=0) as f, contextlib.suppress(OSError):
        while True:  # the last partial block
            f.write(b"\0")


def no_inodes_left(path) -> None:
    """Hold the tmpfs at `path` to the files it has: appending to them works, creating one fails with ENOSPC."""
    st = os.statvfs(path)
    remount(path, f"nr_inodes={st.f_files - st.f_ffree}")


def head_version(url: str, run: str):
    """The newest version on the run's log (None before the trainer made the log or published one)."""
    try:
        return (with_log(url, lambda log: head(log, updates_topic(run), run)) or H.RecordHeaders()).version
    except NoSuchTopic:
        return None


def test_a_file_log_commit_on_a_full_disk_fails_leaving_no_temp_file_and_lands_once_there_is_room(tmpfs):
    disk = tmpfs("log")
    log, group, topic = FileLog(str(disk / "log")), "hilo-site.r.a", "r.updates"
    log.create_topics("r")
    log.commit(group, topic, 3, "m3")
    fill(disk)
    with pytest.raises(LogUnavailable,
                       match=r"committing group 'hilo-site.r.a' at r.updates@5: .*groups.*: no space left on device"):
        log.commit(group, topic, 5, "m5")
    assert log.committed(group, topic) == (3, "m3")
    assert sorted(p.name for p in (disk / "log" / topic / "groups").iterdir()) == [f"{group}.json"]
    remount(disk, GROWN)
    log.commit(group, topic, 5, "m5")
    assert log.committed(group, topic) == (5, "m5")


def test_a_site_whose_log_disk_is_full_keeps_applying_and_its_commit_lands_when_space_returns(tmpfs, tmp_path):
    """The disk is full for new files (its inodes: what a commit's temp file needs), not for the trainer's appends, so
    the site has versions to go on applying while its commits fail."""
    disk = tmpfs("log", "size=16m,nr_inodes=256")
    url, run = f"file://{disk}/log", new_run("full")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url))
    err = tmp_path / "a.err"
    with open(err, "w") as f:
        site = hilo("consume", "--log", url, "--run", run, "--site", "a", "--state-dir", str(tmp_path / "a"),
                    "--no-export",
                    "--no-progress", stderr=f)
    group, topic = site_group(run, "a"), updates_topic(run)

    def committed():
        return (with_log(url, lambda log: log.committed(group, topic)) or (None,))[0]

    def said(pattern):
        return re.findall(pattern, err.read_text())
    with reaped(site):
        publish_random(producer, 2)
        wait_until(lambda: said(r"site a: v2 digest"), 120, "site a applies v2")
        end = with_log(url, lambda log: log.end_offset(topic))
        wait_until(lambda: committed() == end, 30, "site a commits v2")
        no_inodes_left(disk)  # a new file (the commit's) cannot be created; the trainer's appends still fit
        publish_random(producer, 2, seed=1)
        wait_until(lambda: said(r"site a: v4 digest"), 120, "site a goes on applying to v4")
        wait_until(lambda: said(r"site a: committing its position failed \(.*no space left on device\)"), 30,
                   "the warning")
        assert committed() == end  # still the old position meanwhile (what `hilo lag` shows)
        remount(disk, GROWN)
        end = with_log(url, lambda log: log.end_offset(topic))
        wait_until(lambda: committed() == end, 35, "site a's commit lands within one backoff of space returning")
        lag = hilo("lag", "--log", url, "--run", run, "--json")
        with reaped(lag):
            out, _ = lag.communicate(timeout=120)
        row, = json.loads(out)
        assert (row["applied_version"], row["lag"], row["current_offset"]) == (4, 0, end), out
        site.send_signal(signal.SIGTERM)
        assert site.wait(timeout=120) == 0
    producer.close()
    text = err.read_text()
    assert "Traceback" not in text and "Exception in thread" not in text, text[-3000:]
    assert len(said(r"committing its position failed")) == 1, text[-3000:]  # once per streak
    assert len(said(r"position committed again")) == 1, text[-3000:]


def test_a_site_whose_state_dir_is_full_stops_with_one_line_and_resumes_at_the_same_digest(tmpfs, tmp_path):
    state = tmpfs("state")
    url, run = f"file://{tmp_path}/log", new_run("full")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url))
    publish_random(producer, 4)
    fill(state)
    args = ("consume", "--log", url, "--run", run, "--site", "a", "--state-dir", str(state), "--no-export",
            "--no-progress")
    first = hilo(*args, "--snapshot-every", "2")
    with reaped(first):
        _, err = first.communicate(timeout=300)
    assert first.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    line = next(ln for ln in err.splitlines() if ln.startswith("hilo consume: error:"))
    assert re.search(rf"cannot write the snapshot of v\d to {state}/snapshot.tmp-\d+/state.bin: no space left on "
                     rf"device "
                     r"\(the snapshot needs about .* MB; .* MB free\); nothing acknowledged was lost", line), line
    assert not list(state.glob("snapshot.*"))
    dead = subprocess.Popen(["true"])  # a save killed mid-way left its temp folder; its PID is gone
    dead.wait()
    (state / f"snapshot.tmp-{dead.pid}").mkdir()
    os.remove(state / "filler")
    (state / f"snapshot.tmp-{dead.pid}" / "state.bin").write_bytes(b"torn")
    second = hilo(*args, "--until-version", "4")
    with reaped(second):
        out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    assert f"a: v4 digest {producer.replica.digest.hex()}" in out
    assert [p.name for p in state.iterdir()] == ["snapshot"]
    producer.close()


@pytest.mark.slow
def test_a_trainer_whose_state_dir_is_full_stops_with_one_line_and_a_restart_resumes(tmpfs, tmp_path):
    state = tmpfs("state")
    url, run = f"file://{tmp_path}/log", new_run("full")
    fill(state)
    args = ("produce", "--log", url, "--run", run, "--state-dir", str(state), "--checkpoint-every", "1")
    first = hilo(*args, "--steps", "2")
    with reaped(first):
        _, err = first.communicate(timeout=300)
    assert first.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    line = next(ln for ln in err.splitlines() if ln.startswith("hilo produce: error:"))
    assert re.search(rf"cannot write the snapshot of v\d to {state}/snapshot.tmp-\d+/\S+: no space left on device "
                     r"\(.*\); nothing acknowledged was lost .*a restart resumes", line), line
    assert not list(state.glob("snapshot.*"))
    published = head_version(url, run)
    remount(state, GROWN)
    second = hilo(*args, "--steps", "1")
    with reaped(second):
        out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    done = re.search(r"done: v(\d+) digest (\w+)", out)
    assert int(done.group(1)) == published + 1, out
    replica, _ = SnapshotStore(state).load()
    assert (replica.version, replica.digest.hex()) == (published + 1, done.group(2))
    assert [p.name for p in state.glob("snapshot*")] == ["snapshot"]


@pytest.mark.slow
def test_a_trainer_whose_log_disk_is_full_waits_says_why_and_goes_on_when_it_has_room(tmpfs):
    disk = tmpfs("log")
    url, run = f"file://{disk}/log", new_run("full")
    # each trainer is held where it has proposed its second version (HILO_PAUSE_AT): the disk fills between its
    # steps, however fast they go (a poll of the head that missed v1 waited for it forever)
    trainer = hilo("produce", "--log", url, "--run", run, "--steps", "3", "--checkpoint-every", "1000",
                   "--publish-deadline-s", "300", env=os.environ | {"HILO_PAUSE_AT": "trainer.encoded:2"},
                   stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=False)
    with reaped(trainer):
        wait_until(lambda: held(trainer) or trainer.poll() is not None, 300, "the trainer proposes v2")
        assert trainer.poll() is None and head_version(url, run) == 1
        fill(disk)
        trainer.send_signal(signal.SIGCONT)
        wait_for_line(trainer, r"the log is unreachable \(.*(no space left on device|short write).*nothing appended\); "
                               r"waiting", 120)
        assert trainer.poll() is None
        remount(disk, GROWN)
        assert trainer.wait(timeout=300) == 0
        rest = trainer._unread_stderr.decode(errors="replace") + trainer.stderr.read().decode(errors="replace")
        assert head_version(url, run) == 3
        os.remove(disk / "filler")
        late = hilo("produce", "--log", url, "--run", run, "--steps", "2", "--publish-deadline-s", "2",
                    "--checkpoint-every", "1000", env=os.environ | {"HILO_PAUSE_AT": "trainer.encoded:2"})
        with reaped(late):
            wait_until(lambda: held(late) or late.poll() is not None, 300, "the restarted trainer proposes v5")
            assert late.poll() is None and head_version(url, run) == 4
            fill(disk)
            late.send_signal(signal.SIGCONT)
            _, err = late.communicate(timeout=300)
    assert "the log is back after" in rest and "Traceback" not in rest, rest[-3000:]
    assert late.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert re.search(r"hilo produce: error: run .*: v5 was not published within publish_deadline_s = 2s \(it is not on "
                     r"the log; .*nothing appended", err), err[-3000:]
