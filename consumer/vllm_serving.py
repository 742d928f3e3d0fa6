"""A site's link to its vLLM server: check it at start, load each new version, know which version serves.

    hilo consume ... --vllm http://127.0.0.1:8000 --lora-name policy

Requests naming `lora_name` are served by the newest version the site has loaded. A load is
`POST /v1/load_lora_adapter` with `load_inplace` on the exported directory of that version; the
hilo-sync vLLM plugin (ops/vllm/plugin/) makes vLLM read it once (stock vLLM re-reads it on every
request while the in-place flag stays stored). Either way the site never prunes the directory being
served. Supported: vLLM 0.32 (the serving layer the plugin patches; other versions work without it,
re-reading the adapter per request, and the site says so at start).
"""
import json
import logging

import requests

from hilo.schemas.errors import HiloError

from .engine import Engine

logger = logging.getLogger(__name__)
PLUGIN_MARKER = "(hilo-sync: in-place flag cleared)"  # what ops/vllm/plugin appends to a successful in-place load
SUPPORTED = "0.32"  # the vLLM release the plugin patches (ops/vllm/env.sh installs 0.32.0)
NO_RUNTIME_LORA = "start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora"


class VllmError(HiloError):
    """The vLLM server refused or cannot do what a site needs (the message names the cause)."""


class VllmDown(VllmError):
    """The server did not answer (connection refused, timeout, 5xx): worth retrying later."""


class VllmServer(Engine):
    """One vLLM OpenAI-compatible server, seen from a site (the Engine of engine.py).

    url: base URL, e.g. http://127.0.0.1:8000
    lora_name: the adapter name rollout requests use. Default: policy
    timeout_s: per HTTP request. Default: 120
    """

    def __init__(self, url: str, lora_name: str = "policy", timeout_s: float = 120.0):
        self.url, self.lora_name, self.timeout_s = url.rstrip("/"), lora_name, timeout_s
        self.version = None        # vLLM's version string, once checked
        self.plugin = None         # whether the hilo-sync plugin answered, once a load succeeded

    def _call(self, method: str, path: str, **kw) -> requests.Response:
        try:
            r = requests.request(method, self.url + path, timeout=self.timeout_s, **kw)
        except requests.RequestException as e:
            raise VllmDown(f"vLLM at {self.url}: {path}: {type(e).__name__} (is the server running?)") from None
        if r.status_code >= 500 and "add_lora" not in r.text:  # vLLM reports an adapter its worker rejects as a 500
            raise VllmDown(f"vLLM at {self.url}: {path} answered HTTP {r.status_code}")
        return r

    def check(self) -> str:
        """Raise VllmError unless this is a vLLM server; returns its version (VllmDown if it does not answer)."""
        r = self._call("GET", "/version")
        try:
            version = r.json()["version"] if r.status_code == 200 else None
        except (ValueError, KeyError, TypeError):
            version = None
        if version is None:
            raise VllmError(f"{self.url} is not a vLLM server (GET /version answered HTTP {r.status_code}, no vLLM "
                            f"version)")
        self.version = version
        return version

    def base_model(self) -> str:
        """The model the server was started on (its path or name, as `--model` gave it)."""
        r = self._call("GET", "/v1/models")
        try:
            return next(m["root"] for m in r.json()["data"] if m.get("parent") is None)
        except (ValueError, KeyError, TypeError, StopIteration):
            raise VllmError(
                f"vLLM at {self.url}: GET /v1/models answered HTTP {r.status_code} without a base model") from None

    def load(self, adapter_dir, version: int) -> None:
        """Make requests naming `lora_name` use the adapter in `adapter_dir` (policy version `version`)."""
        plugin = self._load(adapter_dir, f"v{version}'s adapter")
        if self.plugin is None and not plugin:
            logger.warning("vLLM at %s (%s) runs without the hilo-sync plugin (ops/vllm/plugin): it re-reads the "
                           "adapter directory on every request; the site keeps the served directory, so this is slow, "
                           "not wrong",
                           self.url, self.version)
        self.plugin = plugin
        logger.info("vLLM at %s now serves v%d as %r", self.url, version, self.lora_name)

    def _load(self, adapter_dir, what: str) -> bool:
        """POST /v1/load_lora_adapter in place under `lora_name`; whether the hilo-sync plugin answered."""
        r = self._call("POST", "/v1/load_lora_adapter",
                       json={"lora_name": self.lora_name, "lora_path": str(adapter_dir), "load_inplace": True})
        if r.status_code == 404 and "lora" not in r.text.lower():
            raise VllmError(f"vLLM at {self.url} has no runtime LoRA loading (POST /v1/load_lora_adapter: HTTP 404); "
                            f"{NO_RUNTIME_LORA}")
        if r.status_code != 200:
            raise VllmError(f"vLLM at {self.url} refused {what} {adapter_dir}: {_reason(r)}")
        return PLUGIN_MARKER in r.text

    def runtime_lora(self) -> bool:
        """Whether the server loads adapters at runtime, asked without loading one: a load naming nothing is refused by
        vLLM's handler (HTTP 400) where the endpoint exists, and is an unknown route (404) where runtime LoRA updating
        is off."""
        r = self._call("POST", "/v1/load_lora_adapter", json={"lora_name": "", "lora_path": ""})
        if r.status_code in (400, 404):
            return r.status_code == 400
        raise VllmError(f"vLLM at {self.url}: a load naming no adapter answered {_reason(r)}; expected HTTP 400 or 404")

    def adapters(self) -> dict:
        """{name: path} of the adapters the server holds (GET /v1/models: the models with a parent)."""
        r = self._call("GET", "/v1/models")
        try:
            return {m["id"]: m["root"] for m in r.json()["data"] if m.get("parent") is not None}
        except (ValueError, KeyError, TypeError):
            raise VllmError(
                f"vLLM at {self.url}: GET /v1/models answered HTTP {r.status_code} without a model list") from None

    def probe_plugin(self, adapter_dir) -> bool:
        """Whether the hilo-sync plugin is active: loads `adapter_dir` in place under `lora_name`, then unloads that
        name (the engine may keep the weights in one of its LoRA slots until another adapter needs it). VllmError if
        vLLM refuses the adapter."""
        try:
            return self._load(adapter_dir, "the adapter")
        finally:
            self._call("POST", "/v1/unload_lora_adapter", json={"lora_name": self.lora_name})

    def next_token_logprobs(self, prefixes, top: int = 5) -> list:
        """For each token-id prefix: {token id: log-probability} of the `top` most likely next tokens (and the greedy
        one) under the adapter `lora_name`, one request for all. What a site compares with its own replica's forward
        pass. (Not vLLM's prompt_logprobs: on the CPU build a prompt_logprobs request batched with another LoRA
        request kills the engine, vLLM 0.32.)"""
        r = self._call("POST", "/v1/completions", json={"model": self.lora_name, "prompt": [list(p) for p in prefixes],
                                                        "max_tokens": 1, "temperature": 0, "logprobs": top,
                                                        "return_tokens_as_token_ids": True, "return_token_ids": True})
        if r.status_code != 200:
            raise VllmError(f"vLLM at {self.url} refused a log-probabilities request: {_reason(r)}")
        try:
            out = []
            for c in sorted(r.json()["choices"], key=lambda c: c["index"]):
                lp = c["logprobs"]
                row = {int(k.rpartition(":")[2]): float(v) for k, v in lp["top_logprobs"][0].items()}
                row[int(c["token_ids"][0])] = float(lp["token_logprobs"][0])
                out.append(row)
            if len(out) != len(prefixes):
                raise ValueError(f"{len(out)} answers for {len(prefixes)} prefixes")
            return out
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise VllmError(f"vLLM at {self.url}: a log-probabilities answer without the next tokens' "
                            f"log-probabilities ({type(e).__name__}: {e})") from None

    def complete(self, prompt_ids, sampling) -> list:
        """`sampling.n` completions of the token ids `prompt_ids` by the adapter `lora_name`: one (completion token ids,
        behaviour log-probability of each, finish reason) per sample. vLLM's log-probabilities are the model's
        own (before temperature and top_p), the quantity the trainer recomputes."""
        r = self._call("POST", "/v1/completions", json={
            "model": self.lora_name, "prompt": list(prompt_ids), "n": sampling.n, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "max_tokens": sampling.max_tokens, "seed": sampling.seed, "logprobs": 0,
            "return_token_ids": True})
        if r.status_code != 200:
            raise VllmError(f"vLLM at {self.url} refused a completion request: {_reason(r)}")
        try:
            choices = sorted(r.json()["choices"], key=lambda c: c["index"])
            return [(tuple(c["token_ids"]), tuple(float(x) for x in c["logprobs"]["token_logprobs"]),
                     c["finish_reason"])
                    for c in choices]
        except (ValueError, KeyError, TypeError) as e:
            raise VllmError(f"vLLM at {self.url}: a completion answer without token ids or log-probabilities "
                            f"({type(e).__name__}: {e}); vLLM >= 0.10 returns them with return_token_ids and "
                            f"logprobs") from None


def _reason(r: requests.Response) -> str:
    """vLLM's error message from a JSON error body (or the start of the body)."""
    try:
        msg = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = r.text[:300]
    return f"HTTP {r.status_code}: {json.dumps(msg)[1:-1]}"
