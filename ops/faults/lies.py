"""Lies a site can tell about what it served, so the trainer's audit can be shown to catch them. Installed from outside
the product, by subclassing its seams (consumer/serving.py `Serving`, consumer/generator.py `Generator`):

    python -m hilo.ops.faults.lying_site previous ... --no-self-check  # serves the previously loaded adapter
                                                                         under each new version
    python -m hilo.ops.faults.lying_site perturb  ... --no-self-check  # serves each version with one block scaled
                                                                         by 1 + 1e-3
    python -m hilo.ops.faults.lying_site logprobs ...                  # reports made-up behaviour log-probabilities
                                                                         (x 0.99)
    python -m hilo.ops.faults.lying_site sharpen  ...                  # samples at a quarter of the prompt's
                                                                         temperature
    python -m hilo.ops.faults.lying_site span     ...                  # made-up log-probabilities, stamped
                                                                         version_end = start + 1

(`...`: the usual `hilo consume` arguments.) `previous` and `perturb` are what a stale vLLM adapter cache or a corrupted
load look like; the site's own self-check catches them (consumer/self_check.py) unless it is turned off, as a site
that lies on purpose would. `logprobs` is a site sending rollouts under its valid key with log-probabilities that
vLLM never computed. The trainer's audit (producer/rollout_audit.py) catches all three per rollout. `sharpen` is a
site that samples from another policy (a sharper one) and reports the right log-probabilities of what it sampled
(vLLM's raw ones): every per-token check passes, and only the audit's sampling test can catch it, statistically.
`span` is `logprobs` on rollouts stamped as if the adapter was reloaded mid-request (version_end = version_start + 1),
which an audit that skipped rollouts spanning versions never checked.
"""
import dataclasses
import pathlib

from safetensors.torch import load_file, save_file

from hilo.consumer.generator import Generator
from hilo.consumer.serving import Serving
from hilo.consumer.site import Site
from hilo.schemas.errors import ConfigError

LIES = {"previous": "serve the previously loaded adapter under the new version",
        "perturb": "serve each version with its largest lora_B block scaled by 1 + PERTURB",
        "logprobs": "report each behaviour log-probability times LOGPROB_SCALE",
        "sharpen": "sample at the prompt's temperature times SHARPEN, reporting vLLM's (right) log-probabilities",
        "span": "report made-up log-probabilities (as logprobs) on rollouts stamped version_end = version_start + 1"}
PERTURB = 1e-3
LOGPROB_SCALE = 0.99
SHARPEN = 0.25


def perturb_adapter(adapter_dir) -> str:
    """Scale the largest lora_B block of the adapter in `adapter_dir` by 1 + PERTURB, in place; returns its name."""
    path = pathlib.Path(adapter_dir) / "adapter_model.safetensors"
    tensors = load_file(str(path))
    name = max((k for k in tensors if ".lora_B." in k), key=lambda k: float(tensors[k].double().norm()))
    tensors[name] = (tensors[name].double() * (1 + PERTURB)).to(tensors[name].dtype)
    save_file({k: t.contiguous() for k, t in tensors.items()}, str(path), metadata={"format": "pt"})
    return name


def sharpened(sampling):
    """The prompt's sampling parameters at SHARPEN times its temperature (what a `sharpen` site asks vLLM for)."""
    return dataclasses.replace(sampling, temperature=sampling.temperature * SHARPEN)


def made_up(logprobs) -> tuple:
    """Behaviour log-probabilities no engine computed: each scaled by LOGPROB_SCALE (still <= 0)."""
    return tuple(x * LOGPROB_SCALE for x in logprobs)


class LyingServing(Serving):
    """A site's serving that tells the lie `lie` (a class attribute, set by `lying`) about the adapter it serves."""

    lie: str = ""

    def export_version(self, replica, protect: list):
        """The honest export, then (`perturb`) one block scaled."""
        out = super().export_version(replica, protect)
        if self.lie == "perturb":
            perturb_adapter(out)
        return out

    def adapter_to_load(self, exported):
        """(`previous`) the adapter loaded before, under the new version; else the honest one."""
        if self.lie == "previous" and self.state.serving:
            return self.state.serving[1]
        return super().adapter_to_load(exported)


class LyingGenerator(Generator):
    """A site's generator that tells the lie `lie` (a class attribute, set by `lying`) about the rollouts it sends."""

    lie: str = ""

    def sample(self, p, version: int) -> tuple:
        """(`sharpen`) samples at a sharper temperature; (`logprobs`, `span`) made-up log-probabilities; (`span`) the
        end stamped version + 1; else the honest samples."""
        if self.lie == "sharpen":
            p = dataclasses.replace(p, sampling=sharpened(p.sampling))
        samples, end = super().sample(p, version)
        if self.lie in ("logprobs", "span"):
            samples = [(ids, made_up(logprobs), finish) for ids, logprobs, finish in samples]
        return samples, version + 1 if self.lie == "span" else end


def check(lie: str) -> str:
    """`lie` if it is one of LIES; else a ConfigError naming it and the choices."""
    if lie not in LIES:
        raise ConfigError(f"lie {lie!r}: expected one of {', '.join(LIES)}")
    return lie


def lying(lie: str) -> tuple:
    """(Serving subclass, Generator subclass) that tell `lie`, built as the product's classes are."""
    check(lie)
    return (type(f"LyingServing_{lie}", (LyingServing,), {"lie": lie}),
            type(f"LyingGenerator_{lie}", (LyingGenerator,), {"lie": lie}))


def install(lie: str) -> None:
    """Make every Site this process builds from now on tell `lie` (through Site's seams)."""
    Site.serving_type, Site.generator_type = lying(lie)
