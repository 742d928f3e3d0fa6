"""vLLM general plugin: after `POST /v1/load_lora_adapter` with `load_inplace`, serve from memory.

vLLM (checked on 0.32) preloads the adapter into the engine in `load_lora_adapter` and then stores the
request, `load_inplace=True` included, as the adapter's request for every later completion; the worker
sees the flag and reloads the adapter from disk on each request (slow, and a pruned directory then fails
with HTTP 500 and kills the engine core). This plugin stores the request with the flag cleared once the
load succeeded: the engine already holds the new weights under the same LoRA id, so later requests use
them; if the adapter is ever evicted it is reloaded from its path, which hilo sites never prune while
serving it. The success message gains "(hilo-sync: in-place flag cleared)" so a site can tell the plugin
is active. Loaded in every vLLM process; it patches only where the OpenAI serving layer is importable.

With HILO_VLLM_SPIN_S set (seconds, >= 0), it also bounds how long a vLLM process spins on its shared-memory
queue after each message before it sleeps on the queue's notify socket. vLLM spins 1 s (sched_yield in a loop):
on a CPU host that the server shares with other work, that is about one CPU-second burnt per request. 0 sleeps
at once, at the cost of a socket wake-up (tens of microseconds) per message. Unset: vLLM's own behaviour.
"""
import logging
import os

logger = logging.getLogger(__name__)
MARKER = "(hilo-sync: in-place flag cleared)"


def register():
    """Entry point of the `vllm.general_plugins` group: the in-place patch, and the spin bound if asked."""
    _serve_inplace_once()
    _bound_spin(os.environ.get("HILO_VLLM_SPIN_S"))


def _bound_spin(raw):
    """Make every shared-memory queue reader of this process spin at most `raw` seconds (None: leave vLLM's 1 s)."""
    if raw is None:
        return
    try:
        spin_s = float(raw)
        if not spin_s >= 0:
            raise ValueError
    except ValueError:
        logger.warning("hilo-sync plugin: HILO_VLLM_SPIN_S=%r is not a number of seconds >= 0; vLLM keeps its spin",
                       raw)
        return
    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError as e:
        logger.warning("hilo-sync plugin: vLLM's shared-memory queue not found (%s); HILO_VLLM_SPIN_S ignored", e)
        return
    original = SpinCondition.wait
    if getattr(original, "_hilo_spin_s", None) is not None:
        return

    def wait(self, timeout_ms=None):
        self.busy_loop_s = spin_s  # read by the original on every call: set it for queues made before the patch too
        return original(self, timeout_ms)

    wait._hilo_spin_s = spin_s
    SpinCondition.wait = wait


def _serve_inplace_once():
    """Patch OpenAIServingModels.load_lora_adapter once: an in-place load is read from disk once, not per request."""
    try:
        import msgspec
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    except ImportError as e:  # another vLLM layout: leave it alone, the site warns that the plugin is inactive
        logger.warning("hilo-sync plugin: vLLM serving layer not found (%s); in-place loads keep vLLM's behaviour", e)
        return
    original = OpenAIServingModels.load_lora_adapter
    if getattr(original, "_hilo_inplace_once", False):
        return

    async def load_lora_adapter(self, request, base_model_name=None):
        result = await original(self, request, base_model_name)
        stored = self.lora_requests.get(request.lora_name)
        if isinstance(result, str) and stored is not None and stored.load_inplace:
            self.lora_requests[request.lora_name] = msgspec.structs.replace(stored, load_inplace=False)
            result = f"{result} {MARKER}"
        return result

    load_lora_adapter._hilo_inplace_once = True
    OpenAIServingModels.load_lora_adapter = load_lora_adapter
