"""What non-HiLo synchronisation would send: the whole bf16 adapter, or a lossless delta of it (PULSE-style)."""
import torch
import zstandard


def bf16_flat(params: list) -> torch.Tensor:
    """All blocks as one flat bf16 tensor (the adapter as inference engines hold it)."""
    return torch.cat([t.reshape(-1) for t in params]).to(torch.bfloat16)


def full_adapter_payload(params: list) -> bytes:
    """The bf16 adapter's raw bytes: what shipping the adapter every step sends."""
    return bf16_flat(params).view(torch.int16).numpy().tobytes()


def lossless_delta_payload(old: list, new: list) -> bytes:
    """Changed bf16 elements as delta-coded uint32 indices + bf16 values, zstd level 3 (exact reconstruction)."""
    o, n = bf16_flat(old).view(torch.int16), bf16_flat(new).view(torch.int16)
    idx = torch.nonzero(o != n).view(-1)
    deltas = torch.diff(idx, prepend=torch.zeros(1, dtype=idx.dtype)).to(torch.int32).numpy().astype("<u4").tobytes()
    vals = n[idx].numpy().astype("<i2").tobytes()
    return zstandard.ZstdCompressor(level=3).compress(len(idx).to_bytes(8, "little") + deltas + vals)


def apply_lossless_delta(flat_bf16: torch.Tensor, payload: bytes) -> torch.Tensor:
    """Apply a lossless delta to a flat bf16 adapter (what a site does on receipt)."""
    raw = zstandard.ZstdDecompressor().decompress(payload)
    n = int.from_bytes(raw[:8], "little")
    idx = torch.cumsum(torch.frombuffer(bytearray(raw[8:8 + 4 * n]), dtype=torch.int32).to(torch.int64), 0)
    vals = torch.frombuffer(bytearray(raw[8 + 4 * n:]), dtype=torch.int16)
    out = flat_bf16.clone().view(torch.int16)
    out[idx] = vals
    return out.view(torch.bfloat16)
