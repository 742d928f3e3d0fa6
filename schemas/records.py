"""The policy records: Manifest (inside checkpoints), UpdateMessage, Checkpoint, KeyRotation (rollouts.py: the return
path)."""
import functools
from dataclasses import dataclass, field

import msgpack
import xxhash

from . import fields as F
from .arrays import nbytes
from .errors import LimitExceeded, MalformedMessage, UnsupportedVersion
from .framing import HEADER_BYTES, KIND_CHECKPOINT, KIND_KEY, KIND_NAMES, KIND_UPDATE, frame, peek_field, unframe
from .limits import DEFAULT_LIMITS, Limits

DIGEST_BYTES = 16  # xxh3-128
NONCE_BYTES = 16   # a history's random nonce


def history_id(v0_digest: bytes, nonce: bytes = b"") -> bytes:
    """Which history a run's records belong to: the v0 digest, hashed with the trainer's random nonce when it drew one,
    so two histories started from equal initial weights (the same seed) are told apart."""
    return xxhash.xxh3_128_digest(v0_digest + nonce) if nonce else v0_digest


ZERO_DIGEST = bytes(DIGEST_BYTES)
# The arithmetic an update's step follows (UpdateMessage.math; SPEC.md, "Update"). 1: AdamW's sqrt is
# torch.sqrt, which on CPU is MKL's vector sqrt: not correctly rounded on its AVX-512 and SSE4.2 code paths, so an
# AVX2 host and an AVX-512 host computed different bits. 2: that sqrt correctly rounded, the same on every IEEE-754
# machine. 3: Muon's matrix products and norm summed in one fixed order (a pairwise tree), the same everywhere; before,
# torch.matmul's (the BLAS's). A message without the field is version 1 (every log written before it), and reads as it
# always did.
MATH_VERSION = 3
# How the state digest is computed (Manifest.digest_version; SPEC.md, "State digest"). 1: one xxh3-128 stream over
# every tensor's bytes, which runs on one core. 2: the stream takes each tensor's own xxh3-128 instead, so tensors
# hash in parallel. 3: it takes each piece's XXH3-64 (whole rows, up to 16K elements), which the apply kernel hashes
# as it writes them. A manifest without the field is version 1 (every run started before it).
DIGEST_VERSION = 3


@dataclass(frozen=True)
class BlockSpec:
    """One LoRA matrix: `module`.lora_`kind`, shape (rank, d_in) for A and (d_out, rank) for B, stored fp32."""

    module: str
    kind: str  # "A" or "B"
    shape: tuple

    @property
    def key(self) -> str:
        """Name as in a PEFT state dict, without the adapter name: '<module>.lora_A'."""
        return f"{self.module}.lora_{self.kind}"

    @property
    def numel(self) -> int:
        """Elements in the block."""
        return self.shape[0] * self.shape[1]


@dataclass(frozen=True)
class Manifest:
    """What every replica must agree on before the first message: the blocks, in canonical order."""

    base_model: str
    rank: int
    alpha: float
    target_modules: tuple
    blocks: tuple  # of BlockSpec, sorted by (module, kind)
    digest_version: int = DIGEST_VERSION  # how this run's state digests are computed (replica/digest.py)

    def __post_init__(self):
        keys = [(b.module, b.kind) for b in self.blocks]
        if keys != sorted(set(keys)):
            raise MalformedMessage("manifest: blocks must be unique and sorted by (module, kind)")

    def to_dict(self) -> dict:
        """The msgpack form (SPEC.md, "Manifest")."""
        return {
            "base_model": self.base_model, "rank": self.rank, "alpha": float(self.alpha),
            "target_modules": list(self.target_modules),
            "blocks": [{"module": b.module, "kind": b.kind, "shape": list(b.shape), "dtype": "float32"}
                       for b in self.blocks],
        # version 1: the bytes it always had
        } | ({"digest_version": self.digest_version} if self.digest_version != 1 else {})

    @functools.cached_property
    def manifest_id(self) -> bytes:
        """xxh3-128 of the canonical msgpack of the manifest: updates name the manifest they were made for (computed
        once)."""
        return xxhash.xxh3_128_digest(msgpack.packb(self.to_dict(), use_bin_type=True))

    @property
    def numel(self) -> int:
        """Trainable parameters in the adapter."""
        return sum(b.numel for b in self.blocks)

    def adapter_bytes(self, bytes_per_value: int = 2) -> int:
        """Size of the adapter's values (bf16 by default): the cost of shipping the adapter itself."""
        return self.numel * bytes_per_value

    @staticmethod
    def from_dict(d: dict, what: str, limits: Limits = DEFAULT_LIMITS) -> "Manifest":
        """Validate and build; every block's shape is checked against the limits."""
        what = f"{what} manifest"
        rank = F.get_int(d, "rank", what, 1, 1 << 16)
        tm = F.get_list(d, "target_modules", what, limits.max_blocks)
        if not all(isinstance(t, str) and 0 < len(t) <= limits.max_name_bytes for t in tm):
            raise MalformedMessage(f"{what}: field 'target_modules' must be a list of names")
        blocks = []
        for i, b in enumerate(F.get_list(d, "blocks", what, limits.max_blocks)):
            bw = f"{what} block {i}"
            module = F.get_str(b, "module", bw, limits.max_name_bytes)
            kind = F.req(b, "kind", bw)
            if kind not in ("A", "B"):
                raise MalformedMessage(f"{bw}: field 'kind' = {kind!r}, expected 'A' or 'B'")
            if F.req(b, "dtype", bw) != "float32":
                raise MalformedMessage(f"{bw}: field 'dtype' = {b['dtype']!r}, expected 'float32'")
            shape = F.get_list(b, "shape", bw, 2)
            if len(shape) != 2 or not all(isinstance(s, int) and not isinstance(s, bool)
                                          and 0 < s <= limits.max_block_elements
                                          for s in shape):
                raise MalformedMessage(f"{bw} '{module}': field 'shape' = {shape!r}, expected two positive ints")
            if shape[0] * shape[1] > limits.max_block_elements:
                raise LimitExceeded(
                    f"{bw} '{module}': shape {shape} has more than {limits.max_block_elements} elements")
            if (kind == "A" and shape[0] != rank) or (kind == "B" and shape[1] != rank):
                axis = "first" if kind == "A" else "second"
                raise MalformedMessage(f"{bw} '{module}.lora_{kind}': shape {shape} does not have the LoRA rank {rank} "
                                       f"on its {axis} axis")
            blocks.append(BlockSpec(module, kind, tuple(shape)))
        digest_version = _known(d, "digest_version", what, DIGEST_VERSION, "state digest version")
        try:
            return Manifest(F.get_str(d, "base_model", what, limits.max_name_bytes), rank,
                            F.get_float(d, "alpha", what), tuple(tm), tuple(blocks), digest_version)
        except MalformedMessage as e:  # Manifest's own invariant (sorted, unique blocks), named by the record here
            raise MalformedMessage(f"{what}: {str(e).removeprefix('manifest: ')}") from None


@dataclass
class UpdateMessage:
    """One policy version: a compressed gradient plus everything needed to apply it identically."""

    run: str
    version: int                 # the version this message produces (>= 1)
    parent_digest: bytes         # digest of the state it applies to
    digest: bytes                # digest of the state it must produce
    manifest_id: bytes
    codec: str
    codec_params: dict
    optimizer: str
    hparams: dict                # this step's optimizer hyperparameters (lr from the schedule, ...)
    blocks: list                 # codec-specific per-block payload maps, each with "i" = manifest block index
    meta: dict = field(default_factory=dict)  # informational (trainer loss, wall time); never affects state
    math: int = MATH_VERSION     # the arithmetic version its step follows (MATH_VERSION says what each means)

    def to_bytes(self, signer=None) -> bytes:
        """Frame as an update record (signed by `signer`, a signing.Signer, if given)."""
        return frame(KIND_UPDATE, {
            "run": self.run, "version": self.version, "parent_digest": self.parent_digest, "digest": self.digest,
            "manifest_id": self.manifest_id, "codec": self.codec, "codec_params": self.codec_params,
            "optimizer": self.optimizer, "hparams": self.hparams, "blocks": self.blocks, "meta": self.meta,
        } | ({"math": self.math} if self.math != 1 else {}), signer=signer)  # version 1: the bytes it always had

    @staticmethod
    def from_body(body: dict, what: str, limits: Limits = DEFAULT_LIMITS) -> "UpdateMessage":
        """Validate the header fields; block payloads are validated by the codec against the manifest."""
        return UpdateMessage(
            run=F.get_str(body, "run", what, limits.max_name_bytes),
            version=F.get_int(body, "version", what, 1),
            parent_digest=F.get_bytes(body, "parent_digest", what, DIGEST_BYTES),
            digest=F.get_bytes(body, "digest", what, DIGEST_BYTES),
            manifest_id=F.get_bytes(body, "manifest_id", what, DIGEST_BYTES),
            codec=F.get_str(body, "codec", what, limits.max_name_bytes),
            codec_params=F.get_scalar_map(body, "codec_params", what, limits.max_params),
            optimizer=F.get_str(body, "optimizer", what, limits.max_name_bytes),
            hparams=F.get_scalar_map(body, "hparams", what, limits.max_params),
            blocks=F.get_list(body, "blocks", what, limits.max_blocks),
            meta=F.get_scalar_map(body, "meta", what, limits.max_params) if "meta" in body else {},
            math=_known(body, "math", what, MATH_VERSION, "arithmetic version"),
        )


def _known(body: dict, field: str, what: str, newest: int, called: str) -> int:
    """A definition version field: 1 where it is absent (written before it existed); newer than this build: refused."""
    if field not in body:
        return 1
    v = F.get_int(body, field, what, 1)
    if v > newest:
        raise UnsupportedVersion(f"{what}: {called} {v}; this build knows 1 to {newest}: upgrade this reader to follow "
                                 f"the run")
    return v


@dataclass
class Checkpoint:
    """Full replica state at a version: manifest, fp32 params, optimizer state. Version 0 is the genesis."""

    run: str
    version: int
    digest: bytes
    manifest: Manifest
    optimizer: str
    params: list                 # bytes per block, fp32 little-endian, manifest order
    slots: list                  # optimizer slot names, e.g. ["m", "v"]
    slot_tensors: list           # per slot: bytes per block, fp32
    scalars: dict                # optimizer scalars (step count, running beta powers), float64
    # the history id: history_id(v0 digest, nonce); which history this is (set by every writer)
    genesis: bytes = ZERO_DIGEST
    nonce: bytes = b""            # v0 only: the random bytes the trainer drew when it started this history

    def to_bytes(self, signer=None) -> bytes:
        """Frame as a checkpoint record (level 1: checkpoints are large and mostly incompressible); signed if
        `signer`."""
        return frame(KIND_CHECKPOINT, {
            "run": self.run, "version": self.version, "digest": self.digest, "manifest": self.manifest.to_dict(),
            "optimizer": self.optimizer, "params": self.params, "slots": self.slots,
            "slot_tensors": self.slot_tensors, "scalars": self.scalars, "genesis": self.genesis,
        } | ({"nonce": self.nonce} if self.nonce else {}), level=1, signer=signer)

    @staticmethod
    def from_body(body: dict, what: str, limits: Limits = DEFAULT_LIMITS) -> "Checkpoint":
        """Validate every field, including each array's byte length against the manifest shape."""
        manifest = Manifest.from_dict(F.req(body, "manifest", what), what, limits)
        n = len(manifest.blocks)
        params = F.get_list(body, "params", what, limits.max_blocks)
        slots = F.get_list(body, "slots", what, 8)
        slot_tensors = F.get_list(body, "slot_tensors", what, 8)
        if len(params) != n:
            raise MalformedMessage(f"{what}: field 'params' has {len(params)} blocks, manifest has {n}")
        if len(slot_tensors) != len(slots) or not all(isinstance(s, str) for s in slots):
            raise MalformedMessage(f"{what}: fields 'slots' and 'slot_tensors' disagree")
        for name, arrays in [("params", params)] + [(f"slot_tensors[{s}]", t) for s, t in zip(slots, slot_tensors)]:
            if not isinstance(arrays, list) or len(arrays) != n:
                raise MalformedMessage(f"{what}: field '{name}' must hold {n} blocks")
            for spec, buf in zip(manifest.blocks, arrays):
                want = nbytes("float32", spec.shape)
                if not isinstance(buf, bytes) or len(buf) != want:
                    got = len(buf) if isinstance(buf, bytes) else type(buf).__name__
                    raise MalformedMessage(f"{what}: {name} block '{spec.key}' is {got} bytes, expected {want}")
        scalars = F.get_scalar_map(body, "scalars", what, limits.max_params)
        version, digest = F.get_int(body, "version", what), F.get_bytes(body, "digest", what, DIGEST_BYTES)
        genesis = F.get_bytes(body, "genesis", what, DIGEST_BYTES)
        nonce = F.get_bytes(body, "nonce", what, NONCE_BYTES) if "nonce" in body else b""
        if version == 0 and genesis != history_id(digest, nonce):
            raise MalformedMessage(f"{what}: a v0 checkpoint's genesis {genesis.hex()} is not the history id of its "
                                   f"digest {digest.hex()} and nonce {nonce.hex() or '(none)'}")
        return Checkpoint(F.get_str(body, "run", what), version, digest, manifest, F.get_str(body, "optimizer", what),
                          params,
                          slots, slot_tensors, {k: float(v) for k, v in scalars.items()}, genesis,
                          nonce if version == 0 else b"")


@dataclass
class KeyRotation:
    """From version `from_version` on, the run is signed by `public_key` (raw Ed25519, 32 bytes); signed by the old
    key."""

    run: str
    from_version: int
    public_key: bytes

    def to_bytes(self, signer=None) -> bytes:
        """Frame as a key record (signed by the key being replaced)."""
        return frame(KIND_KEY, {"run": self.run, "from_version": self.from_version, "public_key": self.public_key},
                     signer=signer)

    @staticmethod
    def from_body(body: dict, what: str, limits: Limits = DEFAULT_LIMITS) -> "KeyRotation":
        """Validate the three fields."""
        return KeyRotation(F.get_str(body, "run", what, limits.max_name_bytes),
                           F.get_int(body, "from_version", what, 1), F.get_bytes(body, "public_key", what, 32))


MAX_SLOTS = 8  # optimizer state tensors per block a checkpoint may hold (Checkpoint.from_body's limit)


def checkpoint_size_bound(manifest: Manifest) -> int:
    """Largest body a checkpoint of `manifest` can legitimately have: fp32 params and up to MAX_SLOTS slots, +
    headroom."""
    return 4 * manifest.numel * (1 + MAX_SLOTS) + len(msgpack.packb(manifest.to_dict(), use_bin_type=True)) + (64 << 10)


def decode_record(data: bytes, what: str, limits: Limits = DEFAULT_LIMITS, max_decompressed: int | None = None):
    """Unframe any record and return an UpdateMessage, a Checkpoint or a KeyRotation.

    A checkpoint's decompressed size is bounded by what its own manifest allows, read first by streaming
    only the body's leading fields: a small record that would inflate to gigabytes is refused unread.
    """
    if len(data) >= HEADER_BYTES and data[6] == KIND_CHECKPOINT and max_decompressed is None:
        manifest = Manifest.from_dict(peek_field(data, "manifest", what, limits), what, limits)
        max_decompressed = checkpoint_size_bound(manifest)
    kind, body = unframe(data, what, limits, max_decompressed)
    if kind == KIND_KEY:
        return KeyRotation.from_body(body, f"{what} (key from v{body.get('from_version', '?')})", limits)
    if kind == KIND_UPDATE:
        return UpdateMessage.from_body(body, f"{what} (update v{body.get('version', '?')})", limits)
    if kind != KIND_CHECKPOINT:
        raise MalformedMessage(f"{what}: a {KIND_NAMES[kind]} record where a policy record (update, checkpoint, key) "
                               f"belongs")
    return Checkpoint.from_body(body, f"{what} ({KIND_NAMES[kind]} v{body.get('version', '?')})", limits)
