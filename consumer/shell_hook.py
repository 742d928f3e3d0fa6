"""The operator's --on-version hook: a shell command run after each newest version is exported (any engine).

vLLM has first-class support instead (vllm_serving.py, `hilo consume --vllm URL`).
"""
import logging
import os
import subprocess

logger = logging.getLogger(__name__)


def run_hook(cmd: str, version: int, adapter_dir, digest: str, timeout_s: float = 300) -> bool:
    """Run `cmd` in a shell with HILO_VERSION, HILO_ADAPTER_DIR, HILO_DIGEST set; False (and a warning) on failure."""
    env = dict(os.environ, HILO_VERSION=str(version), HILO_ADAPTER_DIR=str(adapter_dir), HILO_DIGEST=digest)
    try:
        r = subprocess.run(cmd, shell=True, env=env, timeout=timeout_s, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        logger.warning("on-version hook timed out after %ss for v%d: %s", timeout_s, version, cmd)
        return False
    if r.returncode != 0:
        logger.warning("on-version hook exited %d for v%d: %s\n%s", r.returncode, version, cmd, r.stderr[-2000:])
        return False
    return True
