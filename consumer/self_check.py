"""A site checks its engine after each load: the log-probabilities vLLM gives a fixed probe against its own replica's.

    worst = SelfCheck(server, base_dir=None, dtype="float32", tolerance=1e-4).check(replica)   # SelfCheckFailed if over

The replica is the trainer's state bit for bit (the digest chain proves it); nothing proved that vLLM serves it. A
load that failed silently, a stale adapter cached under the same name, an engine on another dtype, rank or base
model: each gives other log-probabilities for the same tokens. After every load the site asks vLLM for the
log-probabilities of the most likely next tokens after each prefix of a fixed probe (replica/forward.py `probe_ids`),
computes the same with its own forward pass of the version it just loaded (the params as exported: rounded to the export
dtype), and compares them token by token. Over the tolerance it does not generate
with that load, says so in one line naming the version and the worst difference, and retries the load
(consumer/serving.py). The forward pass needs the base model vLLM serves as a local directory (the path vLLM
reports, or `--self-check-base`); it is loaded once, in fp32.
"""
import logging
import math
import os
import time

import torch

from hilo.replica.forward import lora_names, policy_model, probe_ids
from hilo.schemas.errors import ConfigError, HiloError

from .adapter_export import DTYPES

logger = logging.getLogger(__name__)


class SelfCheckFailed(HiloError):
    """vLLM's log-probabilities of the probe differ from the site's own replica's by more than the tolerance."""


class SelfCheck:
    """The check of one site's vLLM server (a consumer/vllm_serving.VllmServer). base_dir: the base model's directory
    (None: the path vLLM reports serving). dtype: the export dtype (what vLLM was given). tolerance: the largest
    per-token |log-probability difference| accepted."""

    def __init__(self, server, base_dir: str | None, dtype: str, tolerance: float):
        if not tolerance > 0:
            raise ConfigError(f"SiteConfig.self_check_tolerance = {tolerance}: must be > 0")
        self.server, self.base_dir, self.dtype, self.tolerance = server, base_dir, DTYPES[dtype], tolerance
        self.model = self.names = self.manifest = self.probe = None
        self.worst, self.seconds = None, 0.0  # the newest check's worst difference and how long it took

    def _model(self, manifest):
        """The base + LoRA model for `manifest`, loaded once (ConfigError when the base is not a local directory)."""
        if self.model is not None and self.manifest == manifest:
            return self.model
        base = self.base_dir or self.server.base_model()
        if not os.path.isdir(base):
            raise ConfigError(f"the self-check needs the base model vLLM serves as a local directory; {base!r} is not "
                              f"one here (--self-check-base DIR names it, --no-self-check turns the check off)")
        self.model = policy_model(base, manifest)
        self.names, self.manifest = lora_names(self.model, manifest), manifest
        self.probe = probe_ids(self.model.config.vocab_size)
        return self.model

    def check(self, replica) -> float:
        """Compare vLLM's log-probabilities of the next token after each prefix of the probe with `replica`'s (the
        version just loaded); the worst difference, or SelfCheckFailed naming the version and it."""
        model = self._model(replica.manifest)
        t0 = time.perf_counter()
        params = {n: p.to(self.dtype).to(torch.float32) for n, p in zip(self.names, replica.state.params)}
        with torch.no_grad():
            logits = torch.func.functional_call(model, params, (torch.tensor([self.probe]),)).logits[0]
        mine = torch.log_softmax(logits.double(), -1)                        # [position, vocab]
        theirs = self.server.next_token_logprobs([self.probe[:k] for k in range(1, len(self.probe) + 1)])
        worst, where = 0.0, (0, 0)
        for k, row in enumerate(theirs):
            for token, lp in row.items():
                d = abs(float(mine[k, token]) - lp) if 0 <= token < mine.shape[1] else math.inf
                if not d <= worst:  # a NaN counts as the worst
                    worst, where = d, (k + 1, token)
        self.worst, self.seconds = worst, time.perf_counter() - t0
        if not worst <= self.tolerance:
            raise SelfCheckFailed(f"vLLM does not serve v{replica.version}: its log-probabilities of the probe differ "
                                  f"from the replica's by up to {worst:.3g} (token {where[1]} after {where[0]} of the "
                                  f"probe's {len(self.probe)} tokens; tolerance {self.tolerance:g})")
        return worst
