"""A pipelined publish (ProducerConfig.pipeline): version v's transaction runs on a background thread while the
trainer computes v+1, and the next step waits for it only before it publishes v+1.

The trainer adopts v as soon as it is proposed (its replica, its encoder's error feedback, the model's params), so
the next forward pass trains on v. What is needed to take that back is kept beside the publish (`undo`): if v turns
out not on the log (a failure, the deadline, a fence), the trainer returns to v-1, the last version the log holds,
before the error is raised; v+1, computed from v, is dropped with it. Everything the log's acknowledgement decides
(the trainer's position and history, its snapshot, the published metrics) waits for that acknowledgement, as in a
step that publishes in line. At most one version is in flight: PipelinedPublish keeps one InFlight at a time.
"""
import threading
import time

from hilo.log import threads
from hilo.schemas import crash_points


class InFlight:
    """One version's publish running on its own thread. `publish()` (no arguments) runs there; `outcome()` waits for
    it and returns what it returned or raises what it raised. `undo`: what UpdateBuilder.revert needs."""

    def __init__(self, proposal, undo, wanted_checkpoint: bool, t0: float, publish):
        self.proposal, self.undo, self.wanted_checkpoint, self.t0 = proposal, undo, wanted_checkpoint, t0
        self.critical_s = 0.0  # the step's own seconds (encode, apply, write-back, any wait): set when step() returns
        self.publish_s = 0.0   # the publish's seconds on its thread
        self._done, self._result, self._error = threading.Event(), None, None
        threads.start(self._run, f"hilo-publish-v{proposal.version}", publish)

    def _run(self, publish) -> None:
        started = time.perf_counter()
        try:
            self._result = publish()
        except BaseException as e:  # noqa: BLE001  (handed to the trainer's thread: its next step raises it)
            self._error = e
        finally:
            self.publish_s = time.perf_counter() - started
            self._done.set()

    def outcome(self):
        """Wait for the publish (it ends by its own deadline); its Published, or raise its error."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result


class PipelinedPublish:
    """The trainer's one version in flight. `start` adopts a proposal before the log holds it (builder and model) and
    runs its publish on a thread; `settle` waits for it and, if the log does not hold it, takes the adoption back.
    What the acknowledgement decides is the caller's (producer/committer.py)."""

    def __init__(self, builder, write_back):
        """`builder`: the trainer's UpdateBuilder (adopt, revert); `write_back()`: copies its params into the model."""
        self.builder, self.write_back = builder, write_back
        self.inflight = None  # the InFlight of the version whose publish runs on its thread (None: none)

    def start(self, proposal, wanted_checkpoint: bool, t0: float, publish) -> None:
        """Adopt `proposal` (the next forward pass trains on it), then let `publish()` run on its thread."""
        self.inflight = InFlight(proposal, self.builder.adopt(proposal), wanted_checkpoint, t0, publish)
        self.write_back()
        crash_points.reach("trainer.ahead")
        self.inflight.critical_s = time.perf_counter() - t0

    def settle(self) -> tuple:
        """Wait for the version in flight (there is one): (its Published, {"wait_s", "publish_s"}). If it is not on the
        log, return the trainer to the version before it (replica, encoder, model) and raise its error."""
        inflight, self.inflight = self.inflight, None
        crash_points.reach("trainer.awaiting")
        t = time.perf_counter()
        try:
            published = inflight.outcome()
        except BaseException:
            self.builder.revert(inflight.undo)
            self.write_back()
            raise
        return published, {"wait_s": time.perf_counter() - t, "publish_s": inflight.publish_s}
