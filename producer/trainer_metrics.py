"""What the trainer records about each version the log took (the "trainer" rows of schemas/metrics.py)."""
import time

import torch


def observe_published(metrics, proposal, nbytes: int, adapter_bytes: int, sign_s: float, transaction_s: float) -> None:
    """The metrics of a version the log now holds: its stages, its size, and the encoder's residual."""
    m, enc = metrics, proposal.encoding
    m.set("published_version", proposal.version)
    m.inc("versions_published")
    m.set("last_published_timestamp_seconds", time.time())
    for stage, seconds in (("encode", proposal.timing["encode"]), ("sign", sign_s), ("transaction", transaction_s)):
        m.observe("stage_seconds", seconds, stage=stage)
    m.observe("message_bytes", nbytes)
    m.set("adapter_fraction", nbytes / adapter_bytes)
    residual = enc.state.get("residual")
    if residual is not None:  # what the encoder kept back over what it was asked to send (residual + sent)
        def dot(x, y):
            return float(torch.dot(x.reshape(-1), y.reshape(-1)))  # no adapter-sized temporaries
        left = sum(dot(r, r) for r in residual)
        whole = left + sum(2 * dot(r, d) + dot(d, d) for r, d in zip(residual, enc.decoded))
        m.set("residual_ratio", (left / whole) ** 0.5 if whole > 0 else 0.0)


def count_skips(metrics, skips: dict | None) -> None:
    """Records the trainer's reads skipped (reason -> how many)."""
    for reason, n in (skips or {}).items():
        metrics.inc("records_refused", n, reason=reason)
