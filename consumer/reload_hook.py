"""After each version: run the operator's hook command, or ask a vLLM server to load the new adapter."""
import json
import logging
import os
import subprocess
import urllib.request

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


def vllm_load_lora(base_url: str, lora_name: str, adapter_dir, timeout_s: float = 120) -> None:
    """POST /v1/load_lora_adapter to a vLLM OpenAI server (started with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).

    `load_inplace` replaces the adapter under the same name, so requests naming it get the new version.
    """
    body = json.dumps({"lora_name": lora_name, "lora_path": str(adapter_dir), "load_inplace": True}).encode()
    req = urllib.request.Request(f"{base_url.rstrip('/')}/v1/load_lora_adapter", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        if resp.status != 200:
            raise RuntimeError(f"vLLM at {base_url} answered {resp.status} to load_lora_adapter {lora_name}")


def main(argv=None):
    """`python -m hilo.consumer.reload_hook --vllm URL --name NAME`: an --on-version hook for vLLM."""
    import argparse
    ap = argparse.ArgumentParser(description="Reload the adapter in HILO_ADAPTER_DIR into a running vLLM server.")
    ap.add_argument("--vllm", default="http://127.0.0.1:8000", help="vLLM server base URL (default: %(default)s)")
    ap.add_argument("--name", default="policy", help="LoRA name requests use (default: %(default)s)")
    a = ap.parse_args(argv)
    vllm_load_lora(a.vllm, a.name, os.environ["HILO_ADAPTER_DIR"])


if __name__ == "__main__":
    main()
