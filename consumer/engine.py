"""Engine: what a site needs from the inference server it feeds (vLLM today: vllm_serving.VllmServer).

A second engine (SGLang, TensorRT-LLM, an in-process one) meets this Protocol: it loads an exported adapter under
the site's name, says what it is, scores prefixes for the site's self-check and samples completions for the return
path. Serving (serving.py), the self-check (self_check.py) and the generating site (generator.py) use only these.
"""
from abc import abstractmethod
from typing import Protocol


class Engine(Protocol):
    """One inference server, seen from a site. `lora_name`: the adapter name requests use; `version`: the engine's
    version string once checked (None before)."""

    lora_name: str
    version: str | None

    @abstractmethod
    def check(self) -> str:
        """Raise unless the server answers as this engine; returns its version."""

    @abstractmethod
    def base_model(self) -> str:
        """The base model the server serves (a path or name)."""

    @abstractmethod
    def load(self, adapter_dir, version: int) -> None:
        """Serve the adapter in `adapter_dir` (policy `version`) under `lora_name`, replacing the one served."""

    @abstractmethod
    def runtime_lora(self) -> bool:
        """Whether adapters can be loaded while the server runs."""

    @abstractmethod
    def next_token_logprobs(self, prefixes, top: int = 5) -> list:
        """For each token-id prefix, the served policy's log-probabilities of the next token (the self-check)."""

    @abstractmethod
    def complete(self, prompt_ids, sampling) -> list:
        """Sample completions of `prompt_ids` with `sampling` from the served adapter (the return path)."""
