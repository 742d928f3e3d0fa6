"""The keyring: one owner for a trainer's signing keys and a site's trusted keys (schemas/keyring.py)."""
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hilo.schemas.framing import split_trailer
from hilo.schemas.keyring import Keyring
from hilo.schemas.records import KeyRotation
from hilo.schemas.signing import OtherKey, Signer, Unsigned


def _signer():
    return Signer(Ed25519PrivateKey.generate())


def test_a_rotation_moves_the_signer_and_the_trust_and_keeps_the_history():
    old, new = _signer(), _signer()
    ring = Keyring(old)
    assert ring.signer is old and ring.verifier.key_id == ring.root.key_id == old.key_id
    assert ring.rotate(new) is old
    assert ring.signer is new and ring.verifier.key_id == ring.root.key_id == new.key_id
    assert ring.history == (old.key_id.hex(), new.key_id.hex())


def test_a_site_trusts_what_it_was_given_then_each_key_it_moves_to():
    old, new = _signer(), _signer()
    ring = Keyring(trusted=old.verifier())
    ring.trust(old.verifier())  # the key trusted now: nothing changes
    ring.trust(None)
    assert ring.history == (old.key_id.hex(),) and ring.signer is None
    ring.trust(new.verifier())
    assert ring.verifier.key_id == new.key_id and ring.root.key_id == old.key_id  # root: the configured key
    for s in (old, new):  # a record signed before the rotation this reader saw still verifies with verify_any
        ring.verify_any(*split_trailer(KeyRotation("r", 1, s.public_bytes()).to_bytes(s), "rec"), "rec")
    intruder = _signer()
    with pytest.raises(OtherKey,
                       match=f"rec: signed by key {intruder.key_id.hex()}, this site trusts key {new.key_id.hex()}"):
        ring.verify_any(*split_trailer(KeyRotation("r", 1, b"\0" * 32).to_bytes(intruder), "rec"), "rec")
    with pytest.raises(Unsigned):
        ring.verify_any(*split_trailer(KeyRotation("r", 1, b"\0" * 32).to_bytes(), "rec"), "rec")


def test_an_empty_keyring_signs_and_verifies_nothing():
    ring = Keyring()
    assert ring.signer is None and ring.verifier is None and ring.root is None and ring.history == ()
    ring.verify_any(b"anything", None, "rec")  # an unsigned run: nothing to check
