"""The keys of one trainer or one site, with one owner (docs/design.md, "trust has one owner").

Trainer side: the Signer it signs with now, and those it signed with before. A rotation is one call, `rotate`: the
trainer, its checkpoints and its rollout exchange hold this keyring (never a copy of a key) and sign with what it
holds when they sign. Site side: the verifiers trusted so far, newest last. The follower moves trust on a signed
'next key' record (`trust`); the replica verifies updates with the key trusted now, the generator prompts with any
key trusted so far. A trainer's keyring trusts its own keys, so the trainer's replica follows the same rules.
"""
from .signing import Signer, Verifier


class Keyring:
    """Who signs (`signer`, trainer side) and whom to trust (`verifier`, every reader), with their history."""

    def __init__(self, signer: Signer | None = None, trusted: Verifier | None = None):
        """`signer`: the trainer's configured key; `trusted`: a site's configured key (`--trust`). Either may be
        None."""
        self._signers = []   # (Signer, its Verifier), oldest first
        self._trusted = []   # Verifiers, oldest first; the last is trusted now
        if signer is not None:
            self.rotate(signer)
        self.trust(trusted)

    @classmethod
    def load(cls, signing_key=None, trust=None) -> "Keyring":
        """From configured paths: a trainer's PEM private key, a site's PEM public key (either may be None)."""
        return cls(Signer.load(signing_key) if signing_key else None, Verifier.load(trust) if trust else None)

    @property
    def signer(self) -> Signer | None:
        """The key the trainer signs with now (None: an unsigned run, or a site)."""
        return self._signers[-1][0] if self._signers else None

    @property
    def verifier(self) -> Verifier | None:
        """The key trusted now (None: this reader verifies nothing)."""
        return self._trusted[-1] if self._trusted else None

    @property
    def root(self) -> Verifier | None:
        """Where a reader whose position records no rotation starts: the trainer's current key, a site's configured
        one."""
        if self._signers:
            return self._signers[-1][1]
        return self._trusted[0] if self._trusted else None

    @property
    def history(self) -> tuple:
        """Key ids (hex), oldest first: the trainer's signing keys, or (a site) the keys it trusted."""
        return tuple(v.key_id.hex() for _, v in self._signers) if self._signers \
            else tuple(v.key_id.hex() for v in self._trusted)

    def rotate(self, new: Signer) -> Signer | None:
        """Sign with `new` from now on, and trust it; returns the signer it replaces (None for the first)."""
        old = self.signer
        self._signers.append((new, new.verifier()))
        self.trust(self._signers[-1][1])
        return old

    def trust(self, verifier: Verifier | None) -> None:
        """Verify with `verifier` from now on (None, or the key trusted now: nothing changes)."""
        if verifier is not None and (self.verifier is None or verifier.key_id != self.verifier.key_id):
            self._trusted.append(verifier)

    def verify_any(self, signed: bytes, trailer: bytes | None, what: str) -> None:
        """Verify with whichever key trusted so far the trailer names (a record signed just before a rotation this
        reader has seen); one it names no trusted key of is refused as the key trusted now refuses it."""
        if self.verifier is None:
            return
        kid = bytes(trailer[:len(self.verifier.key_id)]) if trailer is not None else None
        known = next((v for v in reversed(self._trusted) if v.key_id == kid), None)
        (known or self.verifier).verify(signed, trailer, what)

