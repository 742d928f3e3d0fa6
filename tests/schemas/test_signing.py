"""Ed25519 signatures: only what the trusted key signed is applied; everything else is refused, state unchanged."""
import os

import pytest

from hilo.producer.update_builder import UpdateBuilder
from hilo.replica.codecs import Budget, make_encoder
from hilo.schemas.errors import ChainError, ConfigError, UnsupportedVersion
from hilo.schemas.signing import Signer, SignatureError, Verifier, generate
from tests.conftest import genesis


@pytest.fixture
def keys(tmp_path):
    """(signer, verifier) of one key pair, and a second signer (another key)."""
    mine = generate(tmp_path / "mine")
    other = generate(tmp_path / "other")
    return Signer.load(mine[0]), Verifier.load(mine[1]), Signer.load(other[0])


def _next(manifest, grads, run="test-run"):
    """(trainer replica after v1, the v1 message) — a valid, chained update."""
    trainer = genesis(manifest, run=run)
    site = genesis(manifest, run=run)
    msg = UpdateBuilder(trainer, make_encoder("topk", manifest, Budget(0.2))).step(grads.next(), {"lr": 1e-3})
    return site, msg


def test_a_signed_update_applies_and_every_forgery_is_refused(manifest, grads, keys):
    signer, verifier, other = keys
    site, msg = _next(manifest, grads)
    site.keyring.trust(verifier)
    genuine = msg.to_bytes(signer)
    body_byte = 16 + (len(genuine) - 16 - 72) // 2  # a byte inside the compressed body
    forged = {
        "unsigned": (msg.to_bytes(), r"unsigned; this site trusts key [0-9a-f]{16}"),
        "other key": (msg.to_bytes(other), r"signed by key [0-9a-f]{16}, this site trusts key [0-9a-f]{16}"),
        "one payload byte changed": (genuine[:body_byte] + bytes([genuine[body_byte] ^ 1]) + genuine[body_byte + 1:],
                                     r"does not verify: the record was changed after signing"),
        "trailer key id swapped": (genuine[:-72] + other.key_id + genuine[-64:], r"signed by key"),
    }
    before = site.digest
    for name, (data, error) in forged.items():
        with pytest.raises(SignatureError, match=error):
            site.apply_bytes(data, name)
        assert site.digest == before and site.version == 0, name
    assert site.apply_bytes(genuine, "genuine") and site.digest == msg.digest


def test_a_signed_update_of_another_run_is_refused(manifest, grads, keys):
    signer, verifier, _ = keys
    site, _ = _next(manifest, grads)
    _, theirs = _next(manifest, grads, run="other-run")  # same key, same math, another run
    site.keyring.trust(verifier)
    with pytest.raises(ChainError, match=r"message belongs to run 'other-run'"):
        site.apply_bytes(theirs.to_bytes(signer), "replayed")
    assert site.version == 0


def test_a_schema_1_frame_is_named(manifest, grads):
    site, msg = _next(manifest, grads)
    data = bytearray(msg.to_bytes())
    data[4:6] = (1).to_bytes(2, "little")
    with pytest.raises(UnsupportedVersion,
                       match=r"schema version 1 \(unsigned frames of hilo-sync 0.1\); this build reads 2"):
        site.apply_bytes(bytes(data), "old")


def test_key_files(tmp_path):
    private, public = generate(tmp_path / "k")
    assert oct(os.stat(private).st_mode & 0o777) == "0o600"
    with pytest.raises(ConfigError, match="exists; refusing to overwrite a key"):
        generate(tmp_path / "k")
    os.chmod(private, 0o644)
    with pytest.raises(ConfigError, match=r"mode 0644 lets others read it; chmod 600") as e:
        Signer.load(private)
    # the secret never reaches errors
    assert "PRIVATE KEY" not in str(e.value) and private.read_text() not in str(e.value)
    with pytest.raises(ConfigError, match="not a PEM public key"):
        Verifier.load(private)


def test_a_public_key_given_as_the_signing_key_says_so(tmp_path):
    from hilo.schemas.errors import ConfigError
    from hilo.schemas.signing import Signer, generate
    _, public = generate(tmp_path / "k")
    with pytest.raises(ConfigError, match="this is a public key .*trainer.key"):
        Signer.load(public)
