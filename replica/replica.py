"""PolicyReplica: the replicated state machine. `apply(message)` is the transition every site runs bit-for-bit."""
import collections
import logging

import torch

from hilo.schemas.errors import ConfigError, DivergenceError, Fork, Gap, MalformedMessage, OtherRun
from hilo.schemas.framing import split_trailer
from hilo.schemas.keyring import Keyring
from hilo.schemas.limits import DEFAULT_LIMITS, Limits
from hilo.schemas.records import Checkpoint, Manifest, UpdateMessage, decode_record, history_id

from .codecs import decode as decode_gradient
from .codecs import update_size_bound
from . import finite, kernels
from .optimizers import get_optimizer
from .optimizers.base import Buffers
from .state import ReplicaState

logger = logging.getLogger(__name__)
RECENT = 4096  # versions whose digests are remembered, to tell a harmless duplicate from a fork


class PolicyReplica:
    """One copy of the policy: state, its digest, and atomic, chained `apply`."""

    def __init__(self, state: ReplicaState, run: str, limits: Limits = DEFAULT_LIMITS, digest: bytes | None = None,
                 genesis: bytes | None = None, nonce: bytes = b"", apply: str = "kernel"):
        self.state = state
        self.run = run
        self.limits = limits
        self.digest = digest if digest is not None else state.digest()  # `digest`: already verified by the caller
        # which history this is: the v0 digest hashed with the nonce the trainer drew (records.history_id)
        self.genesis = genesis if genesis is not None else history_id(self.digest, nonce)
        self.nonce = nonce    # kept at v0, so its checkpoint proves the history id
        self.keyring = Keyring()  # what it trusts (a follower's replica shares its reader's: schemas/keyring.py)
        self.recent = collections.OrderedDict({state.version: self.digest})
        # recycle: `compute` writes into the state the last commit replaced, and block temporaries into scratch kept
        # here, so a version allocates no adapter-sized tensors. Only for a replica whose every computed state is
        # committed or dropped before the next compute (a site's follower), and whose callers keep no reference to a
        # replaced state: its tensors are overwritten by the next version. Off by default (the trainer holds proposals).
        self.recycle = False
        self._spare, self._scratch = None, []
        self.apply_mode = apply

    @property
    def verifier(self):
        """The key trusted now (its keyring's; None: unsigned): when set, only records it signed are parsed."""
        return self.keyring.verifier

    @property
    def apply_mode(self) -> str:
        """How `compute` runs a step: "kernel" (the fused kernel where one exists, else the reference path; the
        default), "reference" (the torch path, the specification) or "kernel-only" (refuse a step without a kernel)."""
        return self._apply_mode

    @apply_mode.setter
    def apply_mode(self, mode: str) -> None:
        if mode not in kernels.MODES:
            raise ConfigError(f"apply = {mode!r}: expected one of {list(kernels.MODES)}")
        self._apply_mode = mode

    @staticmethod
    def genesis(run: str, manifest: Manifest, params: list, optimizer: str, nonce: bytes = b"") -> "PolicyReplica":
        """Version 0: the given initial params (cloned to fp32) and zero optimizer state. `nonce`: random bytes the
        trainer draws so that this history is told apart from another started from the same weights (none: the v0
        digest)."""
        opt = get_optimizer(optimizer)
        params = [p.detach().to(torch.float32).clone().contiguous() for p in params]
        # a missing or extra block is an error, not a shorter check
        for p, b in zip(params, manifest.blocks, strict=True):
            if tuple(p.shape) != b.shape:
                raise MalformedMessage(f"genesis: '{b.key}' has shape {tuple(p.shape)}, manifest says {b.shape}")
        slots = {s: [torch.zeros(b.shape) for b in manifest.blocks] for s in opt.slots}
        return PolicyReplica(ReplicaState(manifest, optimizer, 0, params, slots, opt.init_scalars()), run, nonce=nonce)

    @staticmethod
    def from_checkpoint(ckpt: Checkpoint, what: str = "checkpoint") -> "PolicyReplica":
        """Load a checkpoint after verifying its digest (hashed once: the check is the replica's digest)."""
        return PolicyReplica(ReplicaState.from_checkpoint(ckpt, what), ckpt.run, digest=ckpt.digest,
                             genesis=ckpt.genesis, nonce=ckpt.nonce)

    def checkpoint(self) -> Checkpoint:
        """The full state as a checkpoint record."""
        return self.state.to_checkpoint(self.run, self.genesis, self.digest, self.nonce)

    @property
    def version(self) -> int:
        """The last applied version."""
        return self.state.version

    @property
    def manifest(self) -> Manifest:
        """The adapter layout this replica holds."""
        return self.state.manifest

    def parse(self, data: bytes, what: str) -> UpdateMessage:
        """Verify the signature (if this replica trusts a key), then unframe, bounding the size by this manifest."""
        self.verify(data, what)
        return self.decode(data, what)

    def verify(self, data: bytes, what: str) -> None:
        """Refuse a framed record the trusted key did not sign (nothing to do when this replica trusts no key)."""
        if self.verifier is not None:
            self.verifier.verify(*split_trailer(data, what), what)

    def decode(self, data: bytes, what: str) -> UpdateMessage:
        """Unframe an update record, bounding its size by this manifest (no signature check: `parse` does both)."""
        msg = decode_record(data, what, self.limits, update_size_bound(self.manifest))
        if not isinstance(msg, UpdateMessage):
            raise MalformedMessage(f"{what}: expected an update record, got a checkpoint")
        return msg

    def classify(self, msg: UpdateMessage, what: str) -> str:
        """'apply' for the next version, 'duplicate' for one already applied with the same digest; else raise."""
        if msg.run != self.run:
            raise OtherRun(f"{what}: message belongs to run {msg.run!r}, this replica follows {self.run!r}")
        if msg.version <= self.version:
            seen = self.recent.get(msg.version)
            if seen is not None and seen != msg.digest:
                raise Fork(f"{what}: fork at version {msg.version}: digest {msg.digest.hex()} != applied {seen.hex()}")
            return "duplicate"
        if msg.version != self.version + 1:
            raise Gap(f"{what}: gap: message is version {msg.version}, replica is at {self.version} "
                      f"(missing {self.version + 1}..{msg.version - 1})")
        if msg.parent_digest != self.digest:
            raise Fork(f"{what}: fork: version {msg.version} starts from {msg.parent_digest.hex()}, "
                       f"replica v{self.version} is {self.digest.hex()}")
        return "apply"

    def compute(self, msg: UpdateMessage, what: str, decoded: list | None = None) -> ReplicaState:
        """The state `msg` leads to, in new buffers (recycling: the replaced state's); the current state is not touched.

        `decoded`: the gradients `decode` already produced from exactly these blocks (the trainer's encoder
        decodes its own message for error feedback); passing them skips decoding twice.
        """
        if msg.manifest_id != self.manifest.manifest_id:
            raise MalformedMessage(f"{what}: manifest id {msg.manifest_id.hex()} != replica's "
                                   f"{self.manifest.manifest_id.hex()}")
        if msg.optimizer != self.state.optimizer:
            raise MalformedMessage(f"{what}: optimizer {msg.optimizer!r}, this replica's state is for "
                                   f"{self.state.optimizer!r}")
        opt = get_optimizer(msg.optimizer, what)
        hparams = opt.check_hparams(msg.hparams, what)
        module = kernels.pick(self._apply_mode, msg.optimizer)
        if module is not None:
            from .kernels import apply as fused_apply  # here, not at the top: numba loads only where a kernel runs
            return fused_apply.compute(opt, module, self.state, msg, what, hparams, self._buffers(), self.limits,
                                       decoded)
        if decoded is not None:
            grads = decoded
        else:
            grads = decode_gradient(msg.codec, self.manifest, msg.codec_params, msg.blocks, what, self.limits)
        finite.check("decoded gradient", grads, self.manifest, msg, what)  # finite factors can still multiply to Inf
        s = self.state
        params, slots, scalars = opt.step(s.params, grads, s.slots, s.scalars, hparams, self._buffers(), msg.math)
        finite.check("params", params, self.manifest, msg, what)
        for name, tensors in slots.items():
            finite.check(f"optimizer state '{name}'", tensors, self.manifest, msg, what)
        return ReplicaState(s.manifest, s.optimizer, msg.version, params, slots, scalars)

    def _buffers(self) -> Buffers:
        """Where the next step writes: the replaced state's tensors when recycling (never one the current state
        holds), else new ones."""
        if not self.recycle:
            return Buffers()
        spare = self._spare
        if spare is None or spare.optimizer != self.state.optimizer:
            return Buffers(scratch=self._scratch)
        live = {t.data_ptr() for t in self.state.params} | {t.data_ptr() for ts in self.state.slots.values()
                                                            for t in ts}
        own = lambda ts: [None if t.data_ptr() in live else t for t in ts]  # noqa: E731
        return Buffers(own(spare.params), {k: own(ts) for k, ts in spare.slots.items()}, self._scratch)

    def commit(self, state: ReplicaState, digest: bytes) -> None:
        """Swap in a computed state (the only mutation); recycling, the replaced one becomes the next step's buffers."""
        if self.recycle:
            self._spare = self.state
        self.state, self.digest = state, digest
        self.recent[state.version] = digest
        while len(self.recent) > RECENT:
            self.recent.popitem(last=False)

    def apply(self, msg: UpdateMessage, what: str = "message") -> bool:
        """Apply the next version atomically; False for a harmless duplicate. Raises and changes nothing otherwise."""
        if self.classify(msg, what) == "duplicate":
            return False
        state = self.compute(msg, what)
        digest = state.digest()
        if digest != msg.digest:
            state, digest = self._second_opinion(msg, what, digest)
        self.commit(state, digest)
        return True

    def _second_opinion(self, msg: UpdateMessage, what: str, first: bytes) -> tuple:
        """A step that missed the promised digest, looked at again before it stops anything: the held state must still
        hash to its verified digest (else it changed in memory), and the step is computed once more. A second result
        with the promised digest is adopted (it is verified, like any state), loudly; anything else raises, saying
        which."""
        held = self.state.digest()
        if held != self.digest:
            raise DivergenceError(f"{what}: v{self.version}, the state version {msg.version} starts from, changed in "
                                  f"memory after it was verified (hashes to {held.hex()}, verified as "
                                  f"{self.digest.hex()}): a bug or a memory fault on this host; restart it (its "
                                  f"snapshot is checked when loaded)")
        state = self.compute(msg, what)
        digest = state.digest()
        if digest != msg.digest:
            again = "the same again" if digest == first else digest.hex()
            raise DivergenceError(f"{what}: version {msg.version} produced digest {first.hex()}, message promises "
                                  f"{msg.digest.hex()} (computed twice: {again})")
        logger.error("%s: version %d produced digest %s the first time and the promised %s the second: this host "
                     "computed one step two ways (a memory or CPU fault, or a race); the verified result is kept", what,
                     msg.version, first.hex(), digest.hex())
        return state, digest

    def apply_bytes(self, data: bytes, what: str = "message") -> bool:
        """Parse and apply one framed update record."""
        return self.apply(self.parse(data, what), what)
