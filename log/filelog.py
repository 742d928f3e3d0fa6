"""The embedded log (`file://DIR`): one append-only file per topic, for the demo, tests and single machines.

DIR/<topic>/records: a sequence of [u32 magic 'HREC'][u32 length][u32 crc32][msgpack [key, headers, value]].
Offsets are record numbers. Appends hold an exclusive flock and fsync before returning; a torn tail left
by a crash is cut off by the next writer, and readers stop at it. Group positions are small JSON files
replaced atomically. Not a distributed system: several processes on one machine may share it, nothing more.
"""
import fcntl
import json
import os
import pathlib
import struct
import time
import zlib

import msgpack

from hilo.schemas.chunks import Record
from hilo.schemas.errors import ConfigError, LogError, LogUnavailable, NoSuchTopic

from . import atomic_file
from .base import Batch, Log, check_run, checkpoints_topic, prompts_topic, rollouts_topic, updates_topic
from .file_fence import WriterTokens

_HEAD = struct.Struct("<4sII")
_MAGIC = b"HREC"


class FileLog(Log):
    """File-backed single-partition topics under one folder."""

    def __init__(self, root: str):
        self.root = pathlib.Path(root)
        self.url = f"file://{self.root}"
        self._index = {}  # topic -> [file position of each complete record]; extended incrementally
        self._tokens = WriterTokens(self.url, self._dir)  # the fencing tokens this client holds as a run's writer

    # -- topics -------------------------------------------------------------------------------
    def _dir(self, topic):
        return self.root / topic

    def create_topics(self, run, retention_ms=-1):
        """Create the run's topic folders (retention is not enforced by the file log)."""
        check_run(run)
        return self._create((updates_topic(run), checkpoints_topic(run)))

    def create_rollout_topics(self, run, prompt_partitions, retention_ms=-1):
        """Create RUN.prompts and RUN.rollouts folders. The embedded log has one queue per topic: on one machine the
        sites share the prompts by leases, not partitions, so `prompt_partitions` is only checked."""
        check_run(run)
        if prompt_partitions < 1:
            raise ConfigError(f"prompt_partitions = {prompt_partitions}: must be >= 1")
        return self._create((prompts_topic(run), rollouts_topic(run)))

    def _create(self, topics) -> list:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LogError(f"{self.url}: cannot create the log directory ({type(e).__name__}: {e.strerror})") from None
        created = []
        for t in topics:
            if not self._dir(t).exists():
                (self._dir(t) / "groups").mkdir(parents=True)
                (self._dir(t) / "records").touch()
                created.append(t)
        return created

    def _require_root(self):
        if not self.root.is_dir():
            raise NoSuchTopic(f"{self.url}: no such log (directory {self.root} does not exist; a producer creates it)")

    def check_topic(self, topic, partitions=1):
        """The file log has only single-queue, non-compacted topics; it must exist (`partitions` is Kafka's concern)."""
        self._require_root()
        if not (self._dir(topic) / "records").exists():
            raise NoSuchTopic(f"{self.url}: topic {topic!r} does not exist (run `hilo topics create`, or start the "
                              f"producer first)")

    # -- records ------------------------------------------------------------------------------
    def _scan(self, topic, f, truncate=False):
        """Extend the index over complete records; optionally cut a torn tail (writers only)."""
        idx = self._index.setdefault(topic, [])
        pos = idx[-1] if idx else 0
        if idx:
            f.seek(pos)
            head = f.read(_HEAD.size)
            pos += _HEAD.size + _HEAD.unpack(head)[1]
        f.seek(0, os.SEEK_END)
        size = f.tell()
        while pos + _HEAD.size <= size:
            f.seek(pos)
            magic, length, crc = _HEAD.unpack(f.read(_HEAD.size))
            if magic != _MAGIC or pos + _HEAD.size + length > size:
                break
            body = f.read(length)
            if zlib.crc32(body) != crc:
                break
            idx.append(pos)
            pos += _HEAD.size + length
        if truncate and pos < size:
            f.truncate(pos)
            os.fsync(f.fileno())
        return idx

    def become_writer(self, run, version):
        """Take the run's fencing token (+1): appends by any earlier writer of the run are refused from now on."""
        self.check_topic(updates_topic(run))
        with open(self._dir(updates_topic(run)) / "records", "r+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            return self._tokens.take(run, version)

    def append(self, topic, records, partition=0):
        """Append under an exclusive lock and fsync; returns the offsets. A fenced writer's append is refused. One
        queue per topic: `partition` is ignored (prompts are shared by leases, not partitions)."""
        self.check_topic(topic)
        with open(self._dir(topic) / "records", "r+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            self._tokens.check(topic)
            idx = self._scan(topic, f, truncate=True)
            pos = f.seek(0, os.SEEK_END)
            offsets, parts = [], []
            for key, value, headers in records:
                body = msgpack.packb([key, headers, value], use_bin_type=True)
                parts.append(_HEAD.pack(_MAGIC, len(body), zlib.crc32(body)) + body)
                offsets.append(len(idx) + len(offsets))
            # One write for the whole batch: a process killed during an append leaves all of it or none (a torn
            # tail is cut by the next writer), so records appended together (a lease's rollouts) commit together.
            blob = b"".join(parts)
            try:
                written = os.write(f.fileno(), blob)
            except OSError as e:  # not one byte taken (a disk exactly full): waited out as a short write is
                raise LogUnavailable(f"{self.url}: {topic}: writing {len(blob)} bytes: {atomic_file.why(e)}; nothing "
                                     f"appended") from None
            if written != len(blob):
                f.truncate(pos)
                raise LogError(f"{self.url}: {topic}: short write of {len(blob)} bytes (disk full?); nothing appended")
            os.fsync(f.fileno())
            for part in parts:
                idx.append(pos)
                pos += len(part)
        return offsets

    def read(self, topic, offset, timeout_s=1.0, max_bytes=16 << 20, partition=0):
        """Records from `offset`; waits up to `timeout_s` for new ones (polling the file). One queue per topic."""
        self.check_topic(topic)
        deadline = time.monotonic() + timeout_s
        with open(self._dir(topic) / "records", "rb") as f:
            while True:
                idx = self._scan(topic, f)
                if offset < len(idx) or time.monotonic() >= deadline:
                    break
                # poll a file for a writer in another process
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            out, used = Batch(next_offset=max(0, offset)), 0
            for off in range(max(0, offset), len(idx)):
                f.seek(idx[off])
                _, length, _ = _HEAD.unpack(f.read(_HEAD.size))
                key, headers, value = msgpack.unpackb(f.read(length), raw=False)
                out.append(Record(off, key, value, headers))
                out.next_offset = off + 1
                used += length
                if used >= max_bytes:
                    break
            return out

    def begin_offset(self, topic):
        """The file log never deletes: always 0."""
        self.check_topic(topic)
        return 0

    def end_offset(self, topic, partition=0):
        """Number of complete records (one queue per topic)."""
        self.check_topic(topic)
        with open(self._dir(topic) / "records", "rb") as f:
            return len(self._scan(topic, f))

    def retention(self, topic):
        """Nothing expires in the embedded log."""
        self.check_topic(topic)
        return {"retention.ms": "-1 (the embedded log keeps everything)", "retention.bytes": "-1"}

    def trim(self, topic, before):
        """The embedded log keeps every record (one machine, no retention): nothing is deleted."""
        self.check_topic(topic)
        return False

    def prompt_queue(self, run, site, lease_s):
        """Prompts shared by leases under the prompts topic's lock (log/file_leases.py)."""
        from .file_leases import FilePromptQueue
        return FilePromptQueue(self, run, site, lease_s)

    # -- groups -------------------------------------------------------------------------------
    def commit(self, group, topic, offset, metadata):
        """Atomically replace the group's position file. A write that fails (no space, I/O error, permission) is a
        failed commit, as a coordinator's refusal is on Kafka: LogUnavailable, the old position in place, no temp
        file."""
        self.check_topic(topic)
        path = self._dir(topic) / "groups" / f"{group}.json"
        try:
            atomic_file.replace(path, json.dumps({"offset": offset, "metadata": metadata}))
        except OSError as e:
            raise LogUnavailable(
                f"{self.url}: committing group {group!r} at {topic}@{offset}: {atomic_file.why(e)}") from None

    def committed(self, group, topic):
        """(offset, metadata) or None."""
        path = self._dir(topic) / "groups" / f"{group}.json"
        if not path.exists():
            return None
        d = json.loads(path.read_text())
        return d["offset"], d["metadata"]

    def runs(self):
        """Folders RUN.updates holding a records file."""
        self._require_root()
        return sorted(p.parent.name[: -len(".updates")] for p in self.root.glob("*.updates/records"))

    def groups(self, prefix):
        """Groups with a position file in any topic."""
        found = {p.stem for p in self.root.glob("*/groups/*.json")}
        return sorted(g for g in found if g.startswith(prefix))
