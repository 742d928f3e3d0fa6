"""Where a PEFT LoRA model keeps its adapter: the manifest, and its parameters in manifest order."""
import torch

from hilo.schemas.errors import ConfigError, TrainerError
from hilo.schemas.records import BlockSpec, Manifest


def _module_and_kind(name: str, adapter: str):
    # "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" -> ("model.layers.0.self_attn.q_proj", "A")
    for kind in ("A", "B"):
        suffix = f".lora_{kind}.{adapter}.weight"
        if name.endswith(suffix):
            module = name[: -len(suffix)]
            return module.removeprefix("base_model.model."), kind
    return None


def lora_parameters(model: torch.nn.Module, adapter: str = "default"):
    """(manifest, [torch.nn.Parameter in manifest order]) of a peft LoRA model's adapter `adapter`."""
    found = {}
    for name, p in model.named_parameters():
        mk = _module_and_kind(name, adapter)
        if mk is not None:
            found[mk] = p
    if not found:
        raise ConfigError(f"model has no LoRA parameters for adapter {adapter!r} (is it a peft LoRA model?)")
    cfg = model.peft_config[adapter]
    keys = sorted(found)
    blocks = tuple(BlockSpec(m, k, tuple(found[(m, k)].shape)) for m, k in keys)
    target = cfg.target_modules
    target = tuple(sorted(target)) if isinstance(target, (set, list, tuple)) else (str(target),)
    manifest = Manifest(cfg.base_model_name_or_path or "unknown", int(cfg.r), float(cfg.lora_alpha), target, blocks)
    return manifest, [found[k] for k in keys]


def lora_gradients(params: list, manifest: Manifest, run: str, adapter: str) -> list:
    """The LoRA params' .grad in manifest order (zeros for a block outside the graph); refuses none at all, or NaN/Inf."""
    if all(p.grad is None for p in params):
        raise TrainerError(f"run {run}: no LoRA parameter has a gradient (call loss.backward() first; "
                           f"is adapter {adapter!r} trainable?)")
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    for b, g in zip(manifest.blocks, grads):
        if not bool(torch.isfinite(g).all()):
            raise TrainerError(f"run {run}: the gradient of '{b.key}' has NaN/Inf values; nothing was published "
                               f"(skip this step, as a grad scaler does, or lower the learning rate)")
    return grads
