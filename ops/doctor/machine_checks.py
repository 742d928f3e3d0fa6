"""This machine's checks: the fused apply kernels compile (or load from numba's cache) and compute the specification's
bits, the CPU features they are compiled for, free space where a site and the embedded log write."""
import os
import pathlib
import shutil
import time

from .base import fail, ok, warn

FEATURES = ("avx512f", "avx2", "fma", "sse4_2")  # what LLVM vectorises the kernels' loops with, best first
REFERENCE = "sites run the reference path (same bits, slower)"


def kernels(s) -> list:
    """One real update applied by the fused kernel (kernel-only mode) against the torch path; how long the compile or
    cache load took."""
    from hilo.replica import kernels as registry
    why = registry.unavailable("adamw")
    if why is not None:
        return [warn("kernels", f"{why}: {REFERENCE}", "pip install numba (a dependency of hilo-sync)")]
    from hilo.replica.kernels import fused
    before = len(fused.run.signatures)
    trainer, site, message = _one_update()
    t0 = time.perf_counter()
    site.apply_bytes(message, "the doctor's update")
    took, stats = time.perf_counter() - t0, fused.run.stats
    if site.digest != trainer.digest:
        return [fail("kernels", f"the fused kernel's state differs from the specification's after one update "
                                f"({site.digest.hex()[:16]} vs {trainer.digest.hex()[:16]})",
                     "run sites with --apply reference and report this machine's CPU (the cpu line)")]
    if before:
        how = "already compiled in this process"
    elif sum(stats.cache_hits.values()):
        how = f"loaded from numba's cache in {took:.1f} s"
    else:
        how = f"compiled in {took:.1f} s (first use on this machine)"
    found = f"the fused apply kernel {how}; one update's state equals the specification's"
    if not os.access(stats.cache_path, os.W_OK):
        return [warn("kernels",
                     f"{found}; numba cannot write its cache at {stats.cache_path}: every process compiles again",
                     "set NUMBA_CACHE_DIR to a writable directory")]
    return [ok("kernels", f"{found} (cache: {stats.cache_path})")]


def _one_update() -> tuple:
    """(trainer on the reference path, a site in kernel-only mode at v0, v1's framed message) at a tiny adapter
    shape."""
    from hilo.producer.update_builder import UpdateBuilder
    from hilo.replica.codecs import Budget, make_encoder
    from hilo.replica.replica import PolicyReplica
    from hilo.replica.synthetic import GradientStream, initial_params, qwen3_manifest
    manifest = qwen3_manifest("tiny", rank=4)
    trainer = PolicyReplica.genesis("doctor", manifest, initial_params(manifest), "adamw")
    trainer.apply_mode = "reference"
    site = PolicyReplica.from_checkpoint(trainer.checkpoint(), "the doctor's checkpoint")
    site.apply_mode = "kernel-only"
    builder = UpdateBuilder(trainer, make_encoder("spar4", manifest, Budget(0.25)))  # a fused decode and AdamW's step
    return trainer, site, builder.step(GradientStream(manifest, seed=0).next(), {"lr": 1e-3}).to_bytes()


def cpu(s) -> list:
    """The instruction sets the kernels are compiled for (numba targets this machine's CPU)."""
    import llvmlite.binding as llvm
    flags = cpu_flags()
    if flags is None:
        flags = {f.lstrip("+").replace(".", "_") for f in llvm.get_host_cpu_features().flatten().split(",")
                 if f.startswith("+")}
    have = [f for f in FEATURES if f in flags]
    found = f"{llvm.get_host_cpu_name()}: {' '.join(have) or 'none of ' + ', '.join(FEATURES)}"
    if "avx2" not in have and "avx512f" not in have:
        return [warn("cpu", f"{found}: the kernels' loops vectorise with SSE only (same bits, slower)",
                     "run sites on a CPU with AVX2 or AVX-512 where apply time matters")]
    return [ok("cpu",
               f"{found} (the kernels are compiled for this CPU; no FMA contraction, so the bits do not depend on it)")]


def cpu_flags() -> set | None:
    """The CPU's flags from /proc/cpuinfo (None where there is none)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((x for x in text.splitlines() if x.startswith(("flags", "Features"))), "")
    return set(line.partition(":")[2].split())


def disk(s) -> list:
    """Free space in the state dir and the embedded log's directory (the nearest existing parent of one not made
    yet)."""
    c, out = s.config, []
    dirs = [("state dir", c.state_dir)] + ([("file log", c.log[len("file://"):])]
                                           if (c.log or "").startswith("file://") else [])
    for what, d in dirs:
        if d is None:
            continue
        there = pathlib.Path(d).resolve()
        while not there.exists():
            there = there.parent
        if not os.access(there, os.W_OK):
            out.append(fail("disk", f"{what} {d}: {there} is not writable by this user",
                            f"chown or chmod {there}, or choose "
                            f"another directory"))
            continue
        free = shutil.disk_usage(there).free / 1e9
        found = f"{what} {d}: {free:.1f} GB free"
        out.append(warn("disk", f"{found}, under {c.min_free_gb:g} GB: snapshots and adapters may not fit",
                        "free space or move it (--min-free-gb sets this threshold)") if free < c.min_free_gb
                   else ok("disk", found))
    return out
