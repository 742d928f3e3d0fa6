"""hilo-sync as users install it: a wheel and an sdist built from this checkout, installed (not editable, no extras)
on the lowest and the highest Python the package claims, where every module imports and every command answers.

The virtualenvs come from ops/pythons.sh (which ops/test.sh runs first, so this module finds them made); it reads the
claimed range from pyproject.toml, and so do these tests, through it.
"""
import os
import pathlib
import subprocess
import sys
import tarfile
import tomllib
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.xdist_group("heavy")]
# What the commands read at run time besides code (ops/kafka/start.sh for the broker, the plugin vLLM loads, ...)
PACKAGE_DATA = ("hilo/schemas/SPEC.md", "hilo/schemas/ARITHMETIC.md", "hilo/ops/kafka/start.sh",
                "hilo/ops/kafka/pom.xml",
                "hilo/ops/kafka/mirror.sh", "hilo/ops/wan/setup.sh", "hilo/ops/vllm/start.sh",
                "hilo/ops/vllm/plugin/pyproject.toml",
                "hilo/ops/grafana/hilo.json", "hilo/ops/gpu/check.sh")


def _run(*args, **kw) -> subprocess.CompletedProcess:
    """Run a command, text output, with no PYTHONPATH (which would put a source tree before the venv's install); on
    failure, a message with its output (check=True would show none)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, **kw)
    assert out.returncode == 0, (f"{' '.join(map(str, args))} exited "
                                 f"{out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict:
    """{"wheel": path, "sdist": path}: `python -m build` of this checkout (the wheel is built from the sdist)."""
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--outdir", out, ROOT)
    return {"wheel": next(out.glob("*.whl")), "sdist": next(out.glob("*.tar.gz"))}


@pytest.fixture(scope="module")
def pythons() -> dict:
    """{"lowest"/"highest": (version, venv)}: the virtualenvs ops/pythons.sh keeps for the ends of the claimed range."""
    rows = [line.split() for line in _run(ROOT / "ops" / "pythons.sh").stdout.splitlines()]
    assert len(rows) == 2, rows
    return {"lowest": rows[0], "highest": rows[1]}


def _modules() -> set:
    """Every module of the checkout's packages, by its installed name (hilo.replay.follower)."""
    names = set()
    for package, folder in PROJECT["tool"]["setuptools"]["package-dir"].items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            if (path.parent / "__init__.py").exists() and "plugin" not in rel.parts:
                names.add(".".join([package, *[p for p in rel.parts if p != "__init__"]]))
    return names


def test_the_wheel_and_sdist_carry_every_module_and_what_the_commands_read(dists):
    wheel = zipfile.ZipFile(dists["wheel"])
    in_wheel = set(wheel.namelist())
    for name in PACKAGE_DATA:
        assert name in in_wheel, f"{name} is not in {dists['wheel'].name}"
    modules = {n[:-3].replace("/", ".").removesuffix(".__init__") for n in in_wheel if n.endswith(".py")
               and "/plugin/" not in n}
    assert _modules() <= modules, f"missing from the wheel: {sorted(_modules() - modules)}"
    start = wheel.getinfo("hilo/ops/kafka/start.sh")
    assert (start.external_attr >> 16) & 0o111, "ops/kafka/start.sh lost its executable bit in the wheel"
    with tarfile.open(dists["sdist"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for name in ("pyproject.toml", "README.md", "CHANGELOG.md", "schemas/SPEC.md", "ops/kafka/start.sh",
                 "ops/grafana/hilo.json"):
        assert name in names, f"{name} is not in {dists['sdist'].name}"


@pytest.mark.parametrize("end", ["lowest", "highest"])
def test_the_installed_wheel_runs_on_each_end_of_the_claimed_pythons(end, dists, pythons, tmp_path):
    version, venv = pythons[end]
    bin_ = pathlib.Path(venv) / "bin"
    _run(bin_ / "python", "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", dists["wheel"])
    # installed, not this checkout: the package must import from the venv's site-packages
    where = _run(bin_ / "python", "-c", "import hilo.replay.follower as m; print(m.__file__)", cwd=tmp_path).stdout
    assert "site-packages" in where and str(ROOT) not in where, where
    said = _run(bin_ / "hilo", "--version").stdout
    assert said.startswith(f"hilo-sync {PROJECT['project']['version']} (wire format "), said
    assert f"Python {version}." in said, said
    # every module imports (a 3.11-only name anywhere fails here on 3.10)
    imported = _run(bin_ / "python", "-c", "import importlib, sys\n"
                    "for name in sys.argv[1:]: importlib.import_module(name)\nprint(len(sys.argv) - 1)",
                    *sorted(_modules()), cwd=tmp_path).stdout
    assert int(imported) == len(_modules())
    # every command's --help answers (one process: each parse exits 0 after printing)
    helped = _run(bin_ / "python", "-c", "import contextlib, io\nfrom hilo.ops.cli import parser\n"
                  "from hilo.ops.commands import COMMANDS\nfor name in COMMANDS:\n"
                  "    out = io.StringIO()\n"
                  "    with contextlib.redirect_stdout(out):\n"
                  "        try:\n            parser([name, '--help']).parse_args([name, '--help'])\n"
                  "        except SystemExit as e:\n            assert e.code == 0, (name, e.code)\n"
                  "    assert out.getvalue().startswith('usage: hilo ' + name), name\n    print(name)",
                  cwd=tmp_path).stdout
    from hilo.ops.commands import COMMANDS
    assert helped.split() == list(COMMANDS)
    assert _run(bin_ / "hilo", "--help").stdout.startswith("usage: hilo")
    if end == "lowest":
        return  # the demo once, on the newest Python: it compiles the kernels in 4 fresh processes, minutes under load
    # the main job, from the wheel: every site reaches the trainer's digest
    demo = _run(bin_ / "hilo", "demo", "--steps", "9", cwd=tmp_path, timeout=600).stdout
    assert demo.count("  OK  site-") == 3, demo
