"""Write a replica's params as a PEFT adapter directory that `PeftModel.from_pretrained` (and vLLM) load.

DIR/v00000017/{adapter_config.json, adapter_model.safetensors}; written to a temp dir and renamed, so a
reader never sees half an adapter. The newest `keep` versions are kept, and any directory in `protect`
(the one an inference server is serving from) whatever its age, and always the one just written: a dead
incarnation may have left newer directories than the version a restart exports (`discard_beyond` removes them).
"""
import json
import os
import pathlib
import shutil

import torch
from safetensors.torch import save_file

from hilo.schemas import crash_points

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def adapter_config(manifest) -> dict:
    """The adapter_config.json PEFT writes for a LoRA adapter of this manifest."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": manifest.base_model,
        "r": manifest.rank, "lora_alpha": manifest.alpha, "target_modules": list(manifest.target_modules),
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "modules_to_save": None, "use_rslora": False, "use_dora": False, "init_lora_weights": True,
    }


def export_adapter(replica, out_root, dtype: str = "bfloat16", keep: int = 3, protect=()) -> pathlib.Path:
    """Write version `replica.version` under out_root and prune older versions (never those in `protect`); returns its
    directory."""
    root = pathlib.Path(out_root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"v{replica.version:08d}"
    tmp = root / f".tmp-v{replica.version:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    tensors = {f"base_model.model.{b.key}.weight": p.to(DTYPES[dtype]).contiguous()
               for b, p in zip(replica.manifest.blocks, replica.state.params)}
    save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={
        "format": "pt", "hilo_version": str(replica.version), "hilo_digest": replica.digest.hex()})
    (tmp / "adapter_config.json").write_text(json.dumps(adapter_config(replica.manifest), indent=2))
    shutil.rmtree(final, ignore_errors=True)
    crash_points.reach("export.written")
    os.replace(tmp, final)
    prune_adapters(root, keep, (*protect, final))  # never the directory about to be loaded, whatever else is there
    return final


def prune_adapters(out_root, keep: int, protect=()) -> None:
    """Remove all but the newest `keep` version directories, never one in `protect`."""
    protected = {pathlib.Path(p).name for p in protect}
    dirs = version_dirs(out_root)
    for v in sorted(dirs)[:-keep]:
        if dirs[v].name not in protected:
            shutil.rmtree(dirs[v], ignore_errors=True)


def version_dirs(out_root) -> dict:
    """{version: directory} of the adapter directories under out_root (temp dirs and other names are not versions)."""
    root = pathlib.Path(out_root)
    if not root.is_dir():
        return {}
    return {int(p.name[1:]): p for p in root.iterdir() if p.name.startswith("v") and p.name[1:].isdigit()}


def discard_beyond(out_root, version: int) -> list:
    """Remove the adapter directories newer than `version` (left by an incarnation that died after its snapshot; the
    replay writes them again, bit for bit); returns the versions removed."""
    gone = sorted(v for v in version_dirs(out_root) if v > version)
    for v in gone:
        shutil.rmtree(pathlib.Path(out_root) / f"v{v:08d}", ignore_errors=True)
    return gone
