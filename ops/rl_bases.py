"""The base models `hilo rl` can train on: the trainer's copy and the directory a vLLM server loads must be the same.

    python -m hilo.ops.rl_bases student      # writes (or finds) the student's vLLM directory and prints it

tiny     the seeded random tiny Qwen3 (what the tests and `ops/rl.sh` serve): it never answers an addition
         correctly, so its reward stays near 0; it exercises the machinery, not learning.
student  the same architecture pretrained on the digit task (ops/pretrain.RL_STUDENT; greedy test accuracy 0.63,
         sampled at temperature 1 0.39):
         GRPO has something to improve, so `hilo bench rl` compares reward on it.
"""
import os
import pathlib
from dataclasses import dataclass

from hilo.schemas.errors import ConfigError


@dataclass(frozen=True)
class Base:
    """One base: how to build its weights (deterministically) and the directory name vLLM serves it from."""

    name: str
    dir_name: str
    about: str

    def model(self):
        """The base model (transformers Qwen3ForCausalLM, float32, eval mode)."""
        if self.name == "student":
            from hilo.ops.pretrain import RL_STUDENT, pretrained
            return pretrained(RL_STUDENT, log=lambda *a: None)
        from hilo.ops.tiny_trainer import build_base
        return build_base(seed=0)


def _student_dir() -> str:
    from hilo.ops.pretrain import RL_STUDENT, cache_path
    return cache_path(RL_STUDENT).stem  # the spec's hash is in it: a changed student is a new directory


BASES = {b.name: b for b in (
    Base("tiny", "tiny-qwen3-s0-h256-l4", "random tiny Qwen3 (reward ~0: the machinery, not learning)"),
    Base("student", "", "tiny Qwen3 pretrained on the digit task (sampled accuracy 0.39: room to learn)"),
)}


def base(name: str) -> Base:
    """The registered base `name` (ConfigError naming the known ones)."""
    if name not in BASES:
        raise ConfigError(f"base {name!r}: expected one of {', '.join(BASES)}")
    b = BASES[name]
    return Base(b.name, b.dir_name or _student_dir(), b.about)


def vllm_dir(name: str) -> str:
    """The base's transformers directory under $HILO_CACHE/vllm-base (written once, then reused): what vLLM loads."""
    from hilo.ops.tiny_trainer import save_for_vllm
    b = base(name)
    out = pathlib.Path(os.environ.get("HILO_CACHE",
                                      pathlib.Path.home() / ".cache/hilo-sync")) / "vllm-base" / b.dir_name
    if not (out / "config.json").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        save_for_vllm(b.model(), out)
    return str(out)

if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="Write (or find) a base's vLLM directory and print its path.")
    ap.add_argument("name", choices=list(BASES), help="; ".join(f"{b.name}: {b.about}" for b in BASES.values()))
    print(vllm_dir(ap.parse_args().name))
