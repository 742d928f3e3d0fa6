"""The rank-side trainer: HiLoProducer's interface on every rank of a torch.distributed job (rank_launch.py opens it).

One rank publishes (ProducerConfig.publish_rank, the only one with a log); the others hold a PolicyReplica without
one. Step, propose then commit: the publishing rank encodes its gradients (DDP: already all-reduced) and broadcasts
the encoded message at once (a "proposed" frame, before its own apply; its digest is not known yet). Every rank then
computes the step from it, the others while the publishing rank applies and publishes as a lone trainer does. Then
the publishing rank broadcasts the outcome frame: committed (the version and digest the others' computed state must
have; the digest proves the bits), or an error's type and line, or how its replica moved otherwise (a checkpoint, as
when a resync adopted an in-doubt version). The others adopt their computed state only on a commit, write the params
into their model, and raise the publishing rank's error, if any, word for word. A step not published moves no rank;
the apply of the other ranks is off the job's critical path.

Pipelined (ProducerConfig.pipeline): the publishing rank adopts v and starts its publish on a thread, and the outcome
frame says so at once; every rank adopts v too and trains the next step on it. The next collective (step, flush, close)
settles v on the publishing rank before it publishes anything newer (a step proposes v+1 first, as one rank does): if v
is not on the log, that rank returns to v-1 and its frame carries v-1's whole state and the error, which every rank
adopts and raises. So every rank still agrees after every call, and the apply and the publish are both off the job's
critical path.

The encoder's error feedback is trainer-only state: it lives on the publishing rank (its snapshot, its state_dict),
as the log writer does. Sending it each step would cost an fp32 adapter per step per rank.
"""
import time

from hilo.replica.optimizers import get_optimizer
from hilo.replica.replica import PolicyReplica
from hilo.schemas.errors import DivergenceError, TrainerError
from hilo.schemas.records import decode_record

from .rank_transport import Ranks, outcome_frame, pack, raise_as, unpack


def remember(replica: PolicyReplica, recent: list) -> None:
    """Set the (version, digest) pairs `replica` remembers (oldest first; the fork check of a resume reads them)."""
    replica.recent.clear()
    replica.recent.update((v, d) for v, d in recent if v <= replica.version)
    replica.recent[replica.version] = replica.digest


class RankProducer:
    """The Trainer (trainer.py) on every rank of a torch.distributed job. On the publishing rank it wraps the
    HiLoProducer that writes the run (`inner`; its log, metrics and signer are there); on the others it holds a replica
    without a log that applies what that one publishes. Every call that can move the replica (step, rotate_key,
    resync) is a collective: call it on every rank."""

    def __init__(self, ranks: Ranks, model, config, manifest, weights, inner=None, replica=None):
        self.ranks, self.model, self.config, self.manifest, self.weights = ranks, model, config, manifest, weights
        self.params = weights.params
        self.inner, self._replica = inner, replica
        self.rule = get_optimizer(config.optimizer)
        self.master = None  # gradient mode only
        self._last_step, self._fenced = {}, False
        self.follow_s = 0.0  # a non-publishing rank's last step: the broadcast message's decode, apply and write-back
        if inner is not None:
            inner.builder.on_encoded = self._propose
        self._proposed = None  # the publishing rank: the message it sent before the apply (its digest set after)

    def _propose(self, msg) -> None:
        """The publishing rank: send `msg` to the other ranks as soon as it is encoded (they compute its step
        meanwhile)."""
        self.ranks.share(pack({"proposed": msg.to_bytes()}),
                         f"step (sending v{msg.version}'s message before its apply)")
        self._proposed = msg

    @property
    def publishes(self) -> bool:
        """Whether this rank writes the run."""
        return self.inner is not None

    @property
    def replica(self) -> PolicyReplica:
        """This rank's replica (the publishing rank's: its trainer's)."""
        return self.inner.replica if self.inner is not None else self._replica

    @property
    def version(self) -> int:
        """Last published (committed) version, the same on every rank."""
        return self.replica.version

    @property
    def builder(self):
        """The publishing rank's UpdateBuilder (encoder and error feedback); None on the others."""
        return self.inner.builder if self.inner is not None else None

    @property
    def last_step(self) -> dict:
        """The publishing rank's account of the last step (version, bytes, chunks, seconds), on every rank."""
        return self.inner.last_step if self.inner is not None else self._last_step

    @property
    def fenced(self) -> bool:
        """Whether another trainer took the run over."""
        return self.inner.fenced if self.inner is not None else self._fenced

    def write_back(self) -> None:
        """Copy the replica's fp32 params into this rank's model (its dtype)."""
        if self.inner is not None:
            return self.inner.write_back()
        self.weights.write(self._replica.state.params)

    def step(self, meta: dict | None = None, zero_grad: bool = True, **hparams) -> int:
        """HiLoProducer.step on the publishing rank (its gradients, its hyperparameters); every rank then holds the
        version it published, or raises its error unchanged. Returns the version. FSDP2: every rank first
        all-gathers the gradients (the publishing rank encodes them whole)."""
        self.weights.gather(grads=True)
        self._together("step", lambda: self.inner.step(meta, zero_grad, **hparams))
        if zero_grad and self.inner is None:
            self.weights.zero_grad()
        return self.version

    @property
    def pipelined(self) -> bool:
        """Whether the publishing rank publishes on a thread (ProducerConfig.pipeline): flush and close are then
        collectives, since they settle the version in flight and every rank must hear its outcome."""
        return self.config.pipeline

    def flush(self, lag: float | None = None, max_messages: int | None = None) -> int:
        """Gradient mode sends nothing (every rank's replica is the sites'). Pipelined: settles the version in flight
        (a collective); every rank raises its failure, back at the last version the log holds."""
        if self.pipelined:
            self._together("flush", lambda: self.inner.settle())
        return 0

    def lag(self) -> float:
        """Gradient mode: the sites do not trail."""
        return 0.0

    def resync(self) -> None:
        """Settle an in-doubt publish (HiLoProducer.resync) on the publishing rank; every rank follows."""
        self._together("resync", lambda: self.inner.resync())

    def rotate_key(self, new_key_path: str) -> None:
        """HiLoProducer.rotate_key on the publishing rank (the key is read there only); every rank hears the outcome."""
        self._together("rotate_key", lambda: self.inner.rotate_key(new_key_path))

    def save_snapshot(self) -> None:
        """The publishing rank's trainer snapshot (the others keep none). Pipelined: a collective; the version in
        flight is settled first (flush), since a snapshot holds committed versions only."""
        if self.pipelined:
            self.flush()
        if self.inner is not None:
            self.inner.save_snapshot()

    def close(self, flush: bool = True) -> None:
        """The publishing rank saves its snapshot and releases the log; the others hold nothing to release.
        Pipelined: a collective; the version in flight is settled first and its failure raised on every rank."""
        if self.pipelined:
            self._together("close", lambda: self.inner.close(flush))
        elif self.inner is not None:
            self.inner.close(flush)

    def _together(self, what: str, fn) -> None:
        """Run `fn` on the publishing rank, then bring every rank to its replica and raise its error everywhere."""
        if self.inner is None:
            frame, proposal = unpack(self.ranks.share(None, what)), None
            # compute its step while the publishing rank applies and publishes; adopt on commit
            while "proposed" in frame:
                proposal = self._compute(frame["proposed"], what)
                frame = unpack(self.ranks.share(None, what))
            return self._follow(frame, what, proposal)
        inner = self.inner
        before = (inner.version, inner.replica.digest)
        inner.publisher.last_message, self._proposed = None, None
        error = None
        try:
            fn()
        except BaseException as e:  # noqa: BLE001  (the other ranks raise it too, after the frame)
            error = e
        frame = outcome_frame(inner, before, error, self._proposed)
        try:
            self.ranks.share(pack(frame), f"{what} (sending v{frame['version']} to the ranks)")
        except TrainerError as lost:
            raise lost from error
        if error is not None:
            raise error

    def _compute(self, data: bytes, what: str):
        """A non-publishing rank: (message, the state it leads to) from the proposed frame's message, or the error
        computing it raised (raised after the outcome frame, so that the ranks' collectives stay in step)."""
        t0 = time.perf_counter()
        where = f"rank {self.ranks.rank}: {what}, the message proposed by the publishing rank {self.ranks.publish_rank}"
        try:
            msg = self._replica.decode(data, where)
            self._replica.classify(msg, where)
            return msg, self._replica.compute(msg, where), time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001
            return e

    def _follow(self, frame: dict, what: str, proposal=None) -> None:
        """Move this rank's replica as the publishing rank's moved (adopting `proposal`, what _compute made, on a
        commit), then raise its error (if any)."""
        where = f"rank {self.ranks.rank}: {what} v{frame['version']} from the publishing rank {self.ranks.publish_rank}"
        t0 = time.perf_counter()
        if frame.get("commit"):
            if isinstance(proposal, Exception):
                raise proposal
            msg, state, computed_s = proposal
            t0, digest = t0 - computed_s, state.digest()
            if (msg.version, digest) != (frame["version"], bytes(frame["digest"])):
                raise DivergenceError(f"{where}: this rank computed v{msg.version} ({digest.hex()[:12]}), the "
                                      f"publishing rank committed v{frame['version']} "
                                      f"({bytes(frame['digest']).hex()[:12]})")
            self._replica.commit(state, digest)
        elif "message" in frame:
            self._replica.apply(self._replica.decode(frame["message"], where), where)
        elif "checkpoint" in frame:
            older = [(v, d) for v, d in self._replica.recent.items()]
            self._replica = PolicyReplica.from_checkpoint(decode_record(frame["checkpoint"], where), where)
            remember(self._replica, older + list(self._replica.recent.items()))
        if (self._replica.version, self._replica.digest) != (frame["version"], bytes(frame["digest"])):
            raise DivergenceError(f"{where}: this rank holds v{self._replica.version} "
                                  f"({self._replica.digest.hex()[:12]}), the publishing rank v{frame['version']} "
                                  f"({bytes(frame['digest']).hex()[:12]})")
        if frame.get("commit") or "message" in frame or "checkpoint" in frame:
            self.write_back()
        self.follow_s = time.perf_counter() - t0
        self._last_step, self._fenced = frame["last_step"], frame["fenced"]
        if frame["error"] is not None:
            raise_as(frame["error"])
