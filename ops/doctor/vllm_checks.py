"""The vLLM server's checks, through the client a site uses (consumer/vllm_serving.py): it is vLLM and which version,
it loads adapters at runtime, the hilo-sync plugin is active, the base model it serves."""
import os
import pathlib

from hilo.consumer.vllm_serving import NO_RUNTIME_LORA, SUPPORTED, VllmDown, VllmError

from .base import fail, ok, warn

START = "ops/vllm/start.sh BASE_MODEL_DIR starts one"


def version(s) -> list:
    """The server answers and is vLLM; WARN on a release the plugin does not patch."""
    server = s.vllm()
    try:
        v = server.check()
    except VllmDown as e:
        return [fail("vllm", str(e), f"start the server or fix --vllm ({START})")]
    except VllmError as e:
        return [fail("vllm", str(e), "point --vllm at the vLLM server's base URL (http://HOST:PORT)")]
    if not (v == SUPPORTED or v.startswith(SUPPORTED + ".")):
        return [warn("vllm",
                     f"vLLM {v} at {server.url}: the hilo-sync plugin patches vLLM {SUPPORTED} and is inactive on "
                     f"other releases (serving stays correct; vLLM re-reads the adapter on every request)",
                     f"run vLLM {SUPPORTED} (ops/vllm/install.sh)")]
    return [ok("vllm", f"vLLM {v} at {server.url}")]


def lora(s) -> list:
    """Runtime LoRA loading is on (asked with a load that names nothing: nothing is loaded)."""
    server = s.vllm()
    if not server.runtime_lora():
        return [fail("vllm-lora",
                     f"vLLM at {server.url} has no runtime LoRA loading (POST /v1/load_lora_adapter is not "
                     f"served): a site cannot load its versions",
                     f"re{NO_RUNTIME_LORA} (ops/vllm/start.sh does)")]
    return [ok("vllm-lora", "runtime LoRA loading is on (POST /v1/load_lora_adapter answers)")]


def plugin(s) -> list:
    """The hilo-sync plugin answers a real in-place load: of the state dir's newest adapter, else of one the server
    holds."""
    server, own = s.vllm(), newest_adapter(s.config.state_dir)
    held = {} if own else server.adapters()
    adapter = own or next(iter(held.values()), None)
    if adapter is None:
        return [warn("vllm-plugin", "cannot tell: no adapter to load (the server holds none, and no --state-dir with "
                                    "exported adapters was given)",
                     "give --state-dir of a site that exported a version")]
    try:
        active = server.probe_plugin(adapter)
    except VllmDown:
        raise
    except VllmError as e:
        if own:  # the site's own adapter: the site would be refused the same way at start
            return [fail("vllm-plugin", f"{e} (this site's newest adapter)", "serve the run's base model with "
                                                                            "--max-lora-rank at least the run's rank")]
        return [warn("vllm-plugin", f"cannot tell: {e}", "give --state-dir of a site that exported a version")]
    if not active:
        return [warn("vllm-plugin", f"vLLM at {server.url} runs without the hilo-sync plugin: it re-reads the adapter "
                                    f"directory on every request (correct, slower)",
                     "install ops/vllm/plugin into the server's Python (ops/vllm/start.sh does) and restart it")]
    return [ok("vllm-plugin", f"the hilo-sync plugin answered a load of {adapter}")]


def base(s) -> list:
    """The base model the server serves; FAIL where --base names another."""
    server, want = s.vllm(), s.config.base
    served = server.base_model()
    if want is not None and _name(served) != _name(want):
        return [fail("vllm-base",
                     f"vLLM at {server.url} serves {served}, not the base {want}: the run's adapters would "
                     f"load onto other weights", "start vLLM on the run's base model (ops/vllm/start.sh "
                                                 "BASE_MODEL_DIR), or fix --base")]
    return [ok("vllm-base", f"serves {served}" + (" (as --base says)" if want is not None else ""))]


def newest_adapter(state_dir) -> str | None:
    """The newest exported adapter directory under STATE_DIR/adapters (consumer/adapter_export.py), or None."""
    if state_dir is None:
        return None
    found = sorted(p for p in pathlib.Path(state_dir, "adapters").glob("v*") if (p / "adapter_config.json").is_file())
    return str(found[-1].resolve()) if found else None


def _name(model: str) -> str:
    return os.path.basename(model.rstrip("/"))
