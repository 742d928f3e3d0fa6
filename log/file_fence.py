"""The embedded log's writer fencing: each run's newest token in UPDATES/writer.json.

A trainer takes the next token when it starts (`FileLog.become_writer`, under the updates topic's append lock); each
append checks, under the same lock, that the token its client holds is still the newest. So once a newer trainer has
started, every append of an earlier one is refused, whichever topic of the run it writes.
"""
import json
import os
import socket
import time

from hilo.schemas.errors import FencedError, LogError

from . import atomic_file
from .base import updates_topic


class WriterTokens:
    """The fencing tokens one FileLog client holds, per run. `topic_dir`: topic -> its folder."""

    def __init__(self, url: str, topic_dir):
        self.url, self._dir, self.held = url, topic_dir, {}

    def _path(self, run):
        return self._dir(updates_topic(run)) / "writer.json"

    def take(self, run: str, version: int) -> int:
        """The run's next token, written atomically and held from now on (the caller holds the append lock)."""
        path = self._path(run)
        old = json.loads(path.read_text()) if path.exists() else {"token": 0}
        me = {"token": old["token"] + 1, "pid": os.getpid(), "host": socket.gethostname(), "version": version,
              "since": round(time.time(), 3)}
        try:
            atomic_file.replace(path, json.dumps(me))
        except OSError as e:
            raise LogError(f"{self.url}: run {run}: cannot take the writer's token ({atomic_file.why(e)}); nothing was "
                           f"published") from None
        self.held[run] = me["token"]
        return me["token"]

    def check(self, topic: str) -> None:
        """FencedError if this client took a token for `topic`'s run and a newer one exists (caller holds the lock)."""
        run = topic.rsplit(".", 1)[0]
        mine = self.held.get(run)
        if mine is None:
            return
        current = json.loads(self._path(run).read_text())
        if current["token"] != mine:
            raise FencedError(f"{self.url}: run {run}: this trainer (token {mine}) was fenced by a newer trainer (pid "
                              f"{current['pid']} on {current['host']}, token {current['token']}) that took over at "
                              f"v{current['version']}; it publishes nothing more")
