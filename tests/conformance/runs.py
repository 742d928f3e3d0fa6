"""The runs the conformance vectors hold, written by the product (a tiny adapter, a few versions each): one per
optimizer and per codec, signed and unsigned, a key rotation and a delta-mode run. make_vectors.py commits them;
test_conformance.py also writes them afresh, so the reference replays what the code writes today."""
import json
import pathlib
import shutil

from cryptography.hazmat.primitives import serialization

RUNS = {  # name -> (optimizer, codec, producer hparams, signed, rotate after this many versions, mode)
    "sgd-nesterov-dense": ("sgd", "dense", {"momentum": 0.9, "nesterov": 1.0, "weight_decay": 0.01}, False, None,
                           "gradient"),
    "sgd-topk": ("sgd", "topk", {"momentum": 0.8}, False, None, "gradient"),
    "adamw-powersgd-signed": ("adamw", "powersgd", {"weight_decay": 0.01}, True, None, "gradient"),
    "lion-spar": ("lion", "spar", {"weight_decay": 0.1}, False, None, "gradient"),
    "adamw-spar4-rotation": ("adamw", "spar4", {}, True, 2, "gradient"),
    "delta-adamw-spar4": ("adamw", "spar4", {}, False, None, "delta"),
    "muon-dense": ("muon", "dense", {"weight_decay": 0.01}, False, None, "gradient"),
}
VERSIONS = 4
MODEL = {"hidden": 32, "layers": 1, "rank": 4}


def raw_public(pub_path) -> str:
    """The raw 32-byte Ed25519 public key of a PEM file, hex."""
    key = serialization.load_pem_public_key(pathlib.Path(pub_path).read_bytes())
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def produce(name: str, out: pathlib.Path, log_url: str | None = None, run: str | None = None) -> dict:
    """Write run `name` (as run id `run`, default `name`) into out/log (or `log_url`); returns what a replayer must
    reproduce (expected.json's content)."""
    from hilo.log import open_log, updates_topic
    from hilo.log.tail import records
    from hilo.producer.producer import HiLoProducer
    from hilo.replica.codecs import Budget
    from hilo.schemas import headers as H
    from hilo.schemas.signing import generate
    from tests.conftest import producer_config, publish_random, small_model

    optimizer, codec, hparams, signed, rotate, mode = RUNS[name]
    out.mkdir(parents=True, exist_ok=True)
    url, run = log_url or f"file://{out / 'log'}", run or name
    keys = [generate(out / "keys" / k) for k in ("old", "new")] if signed else []
    cfg = producer_config(run=run, log=url, budget=Budget(1.0), codec=codec, optimizer=optimizer, hparams=hparams,
                          mode=mode, checkpoint_every=2, signing_key=str(keys[0][0]) if keys else None)
    producer = HiLoProducer.open(small_model(**MODEL), cfg)
    try:
        done = 0
        while done < VERSIONS:
            n = min(VERSIONS - done, (rotate - done) if rotate and done < rotate else VERSIONS)
            publish_random(producer, n, seed=done, scale=0.05)
            done += n
            if rotate and done == rotate:
                producer.rotate_key(str(keys[1][0]))
        if mode == "delta":
            producer.flush(lag=0.0, max_messages=1)  # one flush message (meta flush = 1)
    finally:
        producer.close()
    log = open_log(url)
    try:  # the digest each update promises, from its headers (the reference recomputes it from the bytes)
        digests = {r.headers[H.VERSION]: r.headers[H.DIGEST] for r in records(log, updates_topic(run))
                   if r.headers.get(H.KIND) == "update" and r.headers.get(H.CHUNK, "").startswith("0/")}
    finally:
        log.close()
    trusted = raw_public(keys[0][1]) if keys else None
    if signed:
        shutil.rmtree(out / "keys")  # private keys are never committed; the trusted public key goes into expected.json
    return {"run": run, "optimizer": optimizer, "codec": codec, "mode": mode, "signed": signed, "trusted_key": trusted,
            "digests": dict(sorted(digests.items(), key=lambda kv: int(kv[0])))}


def write_expected(out: pathlib.Path, expected: dict) -> None:
    """expected.json beside the log."""
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
