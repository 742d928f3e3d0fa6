"""Ed25519 signatures on framed records (SPEC.md, "Signatures"), with `cryptography`; no hand-rolled crypto.

The trainer signs the exact bytes of each update and checkpoint frame (header + compressed body: run,
version, parent digest, digest, payload all inside); the signature travels in the frame's trailer. A site
started with the trainer's public key verifies before it decompresses anything, and refuses a record that
is unsigned, signed by another key, or changed after signing.

    hilo keys generate --out DIR      # DIR/trainer.key (mode 0600, the trainer only) and DIR/trainer.pub
"""
import hashlib
import os
import pathlib
import stat

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import ConfigError, HiloError

KEY_ID_BYTES = 8
SIGNATURE_BYTES = 64


class SignatureError(HiloError):
    """A record is unsigned, signed by a key this site does not trust, or its signed bytes were changed."""


class Unsigned(SignatureError):
    """No signature, in a run whose records this reader verifies."""


class OtherKey(SignatureError):
    """Signed by a key this reader does not trust."""


class BadSignature(SignatureError):
    """The signature does not verify: the bytes were changed after signing."""


def key_id(public: Ed25519PublicKey) -> bytes:
    """First 8 bytes of SHA-256 of the raw public key: names a key in errors and in the trailer."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).digest()[:KEY_ID_BYTES]


class Signer:
    """The trainer's private key: `sign(data)` -> trailer (key id + signature over `data`)."""

    def __init__(self, private: Ed25519PrivateKey):
        self._key = private
        self.key_id = key_id(private.public_key())

    @staticmethod
    def load(path) -> "Signer":
        """Load a PEM private key that only its owner can read (refused otherwise, naming the file and its mode)."""
        path = pathlib.Path(path)
        try:
            mode = path.stat().st_mode
            data = path.read_bytes()
        except OSError as e:
            raise ConfigError(f"signing key {path}: cannot be read ({e.strerror})") from None
        if b"PUBLIC KEY-----" in data:
            raise ConfigError(f"signing key {path}: this is a public key (what sites trust with --trust); the trainer "
                              f"signs with the private key beside it (trainer.key)")
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"signing key {path}: mode {stat.S_IMODE(mode):04o} lets others read it; chmod 600 {path}")
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            raise ConfigError(
                f"signing key {path}: not a PEM private key (make one with `hilo keys generate`)") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"signing key {path}: a {type(key).__name__}, expected Ed25519 (`hilo keys generate`)")
        return Signer(key)

    def sign(self, data: bytes) -> bytes:
        """The trailer for `data`: key id + Ed25519 over SHA-256(data) (one fast hash pass instead of Ed25519's two)."""
        return self.key_id + self._key.sign(hashlib.sha256(data).digest())

    def public_bytes(self) -> bytes:
        """The raw 32-byte public key (what a key-rotation record carries)."""
        return self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def verifier(self) -> "Verifier":
        """A Verifier of this key's own signatures (a trainer resuming from the log trusts only itself)."""
        return Verifier(self._key.public_key())


class Verifier:
    """A site's trusted public key: `verify(frame, what)` raises SignatureError unless the trailer verifies."""

    def __init__(self, public: Ed25519PublicKey):
        self._key = public
        self.key_id = key_id(public)

    @staticmethod
    def from_raw(raw: bytes) -> "Verifier":
        """A Verifier of a raw 32-byte Ed25519 public key (from a key-rotation record)."""
        return Verifier(Ed25519PublicKey.from_public_bytes(raw))

    @staticmethod
    def load(path) -> "Verifier":
        """Load a PEM public key (`--trust FILE`)."""
        path = pathlib.Path(path)
        try:
            key = serialization.load_pem_public_key(path.read_bytes())
        except OSError as e:
            raise ConfigError(f"trusted key {path}: cannot be read ({e.strerror})") from None
        except (ValueError, TypeError):
            raise ConfigError(f"trusted key {path}: not a PEM public key (the trainer's trainer.pub)") from None
        if not isinstance(key, Ed25519PublicKey):
            raise ConfigError(f"trusted key {path}: a {type(key).__name__}, expected Ed25519")
        return Verifier(key)

    def verify(self, signed: bytes, trailer: bytes | None, what: str) -> None:
        """`signed`: the frame without its trailer; `trailer`: key id + signature, or None for an unsigned frame."""
        if trailer is None:
            raise Unsigned(
                f"{what}: unsigned; this site trusts key {self.key_id.hex()} and applies only what it signed")
        kid, sig = trailer[:KEY_ID_BYTES], trailer[KEY_ID_BYTES:]
        if kid != self.key_id:
            raise OtherKey(f"{what}: signed by key {kid.hex()}, this site trusts key {self.key_id.hex()}")
        try:
            self._key.verify(sig, hashlib.sha256(signed).digest())
        except InvalidSignature:
            raise BadSignature(f"{what}: the signature by key {kid.hex()} does not verify: the record was changed "
                               f"after signing") from None


def generate(out_dir) -> tuple:
    """Write OUT/trainer.key (PEM, mode 0600) and OUT/trainer.pub; refuses to overwrite. Returns both paths."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    private, public = out / "trainer.key", out / "trainer.pub"
    for p in (private, public):
        if p.exists():
            raise ConfigError(f"{p} exists; refusing to overwrite a key (move it away first)")
    key = Ed25519PrivateKey.generate()
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public
