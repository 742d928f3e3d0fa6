"""The lying sites of the audit's tests (ops/faults/lies.py) are installed from outside the product, through its seams.

Fast: each lie on a real site's Serving (real adapter exports of a real run) or a real Generator (real rollout records);
vLLM does not run here, so the generator's engine is a stand-in that answers every prompt with the same completion. The
audit catching each liar against a real vLLM is tests/ops/test_audit.py (slow)."""
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from hilo.consumer.config import SiteConfig
from hilo.consumer.generator import GenerateConfig, Generator
from hilo.consumer.serving import Serving
from hilo.consumer.site import Site
from hilo.ops import digit_task
from hilo.ops.cli import main
from hilo.ops.faults import lies
from hilo.schemas.errors import ConfigError
from hilo.schemas.metrics import Metrics
from hilo.schemas.rollouts import Sampling, decode_rollout_record
from tests.conftest import new_run
from tests.helpers import lying_site

COMPLETION = ((1, 2, 3), (-0.5, -1.0, -2.0), "stop")  # what the stand-in engine answers, each sample


class _Engine:
    """Stands in for vLLM's completions (it does not run in the fast tests): records the sampling each request asked
    for."""

    version = "stand-in"

    def __init__(self):
        self.asked = []

    def complete(self, prompt_ids, sampling) -> list:
        """`sampling.n` copies of COMPLETION."""
        self.asked.append(sampling)
        return [COMPLETION] * sampling.n


def _serving(tmp_path, lie=None, version=3) -> Serving:
    """A site's real Serving (no vLLM), the lie `lie` told (None: honest), serving v`version`."""
    cfg = SiteConfig(log=f"file://{tmp_path}/log", run="r", site="a", state_dir=str(tmp_path / "a"),
                     export_dtype="float32")
    serving = (lies.lying(lie)[0] if lie else Serving)(cfg, Metrics("site", run="r", site="a"))
    serving.state.on_exported(version, tmp_path / "a" / "adapters" / f"v{version:08d}")
    serving.state.on_loaded()
    return serving


@pytest.mark.parametrize("lie", [None, "logprobs", "sharpen", "span"])
def test_a_lying_generator_sends_real_rollout_records_that_tell_its_lie(tmp_path, logs, lie):
    serving = _serving(tmp_path)
    serving.server = engine = _Engine()
    prompt = next(digit_task.prompts("r", Sampling(2, 1.0, 1.0, 4, 0)))
    kind = lies.lying(lie)[1] if lie else Generator
    gen = kind(GenerateConfig(reward="hilo.ops.digit_task:reward"), logs(f"file://{tmp_path}/log"), serving, "r", "a")
    out = [decode_rollout_record(value, "rollout") for _, value, _ in gen._answer(prompt, 3)]
    assert len(out) == 2 and all(r.version_start == 3 and r.completion_ids == COMPLETION[0] for r in out)
    # as the record keeps them: fp32
    made_up = tuple(torch.tensor([x * lies.LOGPROB_SCALE for x in COMPLETION[1]]).tolist())
    assert [r.logprobs for r in out] == [made_up if lie in ("logprobs", "span") else COMPLETION[1]] * 2
    assert [r.version_end for r in out] == [4 if lie == "span" else 3] * 2
    assert engine.asked == [prompt.sampling if lie != "sharpen" else lies.sharpened(prompt.sampling)]
    assert engine.asked[0].temperature == (lies.SHARPEN if lie == "sharpen" else 1.0)


def test_a_previous_liar_loads_the_adapter_it_loaded_before_under_the_new_version(tmp_path):
    served = tmp_path / "a" / "adapters" / "v00000003"
    newer = tmp_path / "a" / "adapters" / "v00000004"
    assert _serving(tmp_path).adapter_to_load(newer) == newer
    assert _serving(tmp_path, "previous").adapter_to_load(newer) == served
    for lie in ("perturb", "logprobs", "sharpen", "span"):  # the others serve what they exported
        assert _serving(tmp_path, lie).adapter_to_load(newer) == newer


def test_an_unknown_lie_is_one_line_naming_it_and_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"^lie 'lazy': expected one of previous, perturb, logprobs, sharpen, span$"):
        lies.lying("lazy")
    p = lying_site("lazy", "--log", f"file://{tmp_path}/log", "--run", "r", "--site", "s", "--state-dir",
                   str(tmp_path / "s"))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2 and err == ("lying_site: error: lie 'lazy': expected one of previous, perturb, logprobs, "
                                         "sharpen, span\n")
    assert not (tmp_path / "s").exists()


def test_install_sets_the_sites_seams_and_the_product_is_honest_without_it(monkeypatch):
    assert (Site.serving_type, Site.generator_type) == (Serving, Generator)
    for attr in ("serving_type", "generator_type"):
        monkeypatch.setattr(Site, attr, getattr(Site, attr))  # restored when the test ends
    lies.install("span")
    assert issubclass(Site.serving_type, lies.LyingServing) and issubclass(Site.generator_type, lies.LyingGenerator)
    assert Site.serving_type.lie == Site.generator_type.lie == "span"


def test_the_launcher_runs_hilo_consume_with_the_lie_installed(tmp_path, capsys):
    """`python -m hilo.ops.faults.lying_site perturb ARGS` is `hilo consume ARGS` whose exports have one block scaled by
    1 + PERTURB: beside an honest site of the same run, v2's adapters differ in that block alone."""
    url, run = f"file://{tmp_path}/log", new_run("lies")
    assert main(["produce", "--log", url, "--run", run, "--steps", "2", "--codec", "dense"]) == 0
    digest = capsys.readouterr().out.strip().splitlines()[-1].split()[-1]
    args = ("--log", url, "--run", run, "--until-version", "2", "--no-progress", "--export-dtype", "float32")
    assert main(["consume", *args, "--site", "honest", "--state-dir", str(tmp_path / "honest")]) == 0
    liar = lying_site("perturb", *args, "--site", "liar", "--state-dir", str(tmp_path / "liar"))
    out, err = liar.communicate(timeout=300)
    assert liar.returncode == 0 and out.strip() == f"liar: v2 digest {digest}", err[-3000:]  # its replica is exact
    honest, lied = (load_file(str(tmp_path / s / "adapters" / "v00000002" / "adapter_model.safetensors"))
                    for s in ("honest", "liar"))
    assert honest.keys() == lied.keys()
    changed = [k for k in honest if not torch.equal(honest[k], lied[k])]
    assert len(changed) == 1 and ".lora_B." in changed[0], changed
    was, now = honest[changed[0]].double(), lied[changed[0]].double()
    assert (was != 0).any() and torch.allclose(now, was * (1 + lies.PERTURB), rtol=1e-6, atol=0)


def test_nothing_in_the_product_lies():
    """No lie, HILO_LIE read or lie branch ships in consumer/: the only lies are the ones ops/faults installs."""
    root = lies.__file__.rsplit("/ops/", 1)[0]
    found = subprocess.run(["grep", "-rnE", r"HILO_LIE|\blie\b|made_up|perturb_adapter|sharpened", f"{root}/consumer"],
                           capture_output=True, text=True)
    assert found.returncode == 1, found.stdout
