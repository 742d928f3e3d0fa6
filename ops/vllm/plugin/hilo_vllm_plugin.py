"""vLLM general plugin: after `POST /v1/load_lora_adapter` with `load_inplace`, serve from memory.

vLLM (checked on 0.32) preloads the adapter into the engine in `load_lora_adapter` and then stores the
request, `load_inplace=True` included, as the adapter's request for every later completion; the worker
sees the flag and reloads the adapter from disk on each request (slow, and a pruned directory then fails
with HTTP 500 and kills the engine core). This plugin stores the request with the flag cleared once the
load succeeded: the engine already holds the new weights under the same LoRA id, so later requests use
them; if the adapter is ever evicted it is reloaded from its path, which hilo sites never prune while
serving it. The success message gains "(hilo-sync: in-place flag cleared)" so a site can tell the plugin
is active. Loaded in every vLLM process; it patches only where the OpenAI serving layer is importable.
"""
import logging

logger = logging.getLogger(__name__)
MARKER = "(hilo-sync: in-place flag cleared)"


def register():
    """Entry point of the `vllm.general_plugins` group: patch OpenAIServingModels.load_lora_adapter once."""
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
