"""Adapter shapes of real models and synthetic LoRA gradients with decaying, unequal spectra (benchmarks and tests).

Gradient generator (used by `hilo bench codecs` and the tests): block b of shape (m, n), r = min(m, n),
gets G_b = A diag(sigma_b) B with A (m, r), B (r, n) i.i.d. N(0, 1/m), N(0, 1/n) and
sigma_{b,i} = s_b * d_b^i: a per-block scale s_b ~ LogNormal(0, 1) (blocks differ in importance) and a
per-block decay d_b ~ U(0.6, 0.95) (blocks differ in how low-rank they are). Seeded; one draw per step.
"""
import torch

from hilo.schemas.records import BlockSpec, Manifest

QWEN3 = {
    # name: (hidden, intermediate, layers, q_out (= heads * head_dim), kv_out)
    "qwen3-1.7b": (2048, 6144, 28, 2048, 1024),
    "qwen3-0.6b": (1024, 3072, 28, 2048, 1024),
    "qwen3-8b": (4096, 12288, 36, 4096, 1024),
    "tiny": (64, 128, 2, 64, 32),
}
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def qwen3_manifest(shape: str = "qwen3-1.7b", rank: int = 64, alpha: float = 128.0) -> Manifest:
    """Manifest of a LoRA adapter at `rank` on all seven linear projections of every layer."""
    hidden, inter, layers, q_out, kv_out = QWEN3[shape]
    io = {"q_proj": (hidden, q_out), "k_proj": (hidden, kv_out), "v_proj": (hidden, kv_out), "o_proj": (q_out, hidden),
          "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}
    blocks = []
    for layer in range(layers):
        for t in TARGETS:
            module = f"model.layers.{layer}.{'mlp' if t in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{t}"
            d_in, d_out = io[t]
            blocks += [BlockSpec(module, "A", (rank, d_in)), BlockSpec(module, "B", (d_out, rank))]
    blocks.sort(key=lambda b: (b.module, b.kind))
    return Manifest(f"synthetic/{shape}", rank, alpha, TARGETS, tuple(blocks))


class GradientStream:
    """Seeded synthetic gradients for a manifest, one list of tensors per `next()`."""

    def __init__(self, manifest: Manifest, seed: int = 0, scale: float = 1.0):
        self.manifest = manifest
        self.gen = torch.Generator().manual_seed(seed)
        n = len(manifest.blocks)
        self.block_scale = torch.exp(torch.randn(n, generator=self.gen)) * scale   # s_b
        self.block_decay = 0.6 + 0.35 * torch.rand(n, generator=self.gen)          # d_b

    def next(self) -> list:
        """One step's gradients, manifest order."""
        out = []
        for b, spec in enumerate(self.manifest.blocks):
            m, n = spec.shape
            r = min(m, n)
            sigma = self.block_scale[b] * self.block_decay[b] ** torch.arange(r, dtype=torch.float32)
            A = torch.randn(m, r, generator=self.gen) / m ** 0.5
            B = torch.randn(r, n, generator=self.gen) / n ** 0.5
            out.append((A * sigma) @ B)
        return out


def initial_params(manifest: Manifest, seed: int = 0) -> list:
    """PEFT-style init: A ~ small uniform, B = 0 (the adapter starts as a no-op)."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.rand(b.shape, generator=gen) - 0.5) * (2 / b.shape[1] ** 0.5) if b.kind == "A"
            else torch.zeros(b.shape)
            for b in manifest.blocks]
