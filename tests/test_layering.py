"""Dependencies run one way: schemas -> replica -> log -> replay -> {producer, consumer} -> ops (docs/design.md,
"Folders").

Every import of every module (top level and inside functions) is read with ast; an import of a higher
layer, or between producer and consumer, fails the test with the file, line and edge.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = {"schemas": 0, "replica": 1, "log": 2, "replay": 3, "producer": 4, "consumer": 4, "ops": 5}


def imported_layers(path: pathlib.Path):
    """(line, layer imported) for every `hilo.<layer>` import in one source file; relative imports stay in-layer."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "hilo"]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "hilo" and len(parts) > 1 and parts[1] in LAYERS:
                yield node.lineno, parts[1]


def edges():
    """{(from layer, to layer): [file:line, ...]} over the whole package."""
    out = {}
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            for line, target in imported_layers(path):
                if target != layer:
                    out.setdefault((layer, target), []).append(f"{path.relative_to(ROOT)}:{line}")
    return out


def test_imports_run_one_way():
    found = edges()
    bad = {e: where for e, where in found.items() if LAYERS[e[1]] >= LAYERS[e[0]]}
    assert not bad, "upward or sideways imports: " + "; ".join(f"{a} -> {b} at {', '.join(w)}" for (a, b),
                                                               w in bad.items())
    # The checker sees real edges (it would pass vacuously if it parsed nothing).
    assert {("replica", "schemas"), ("replay", "replica"), ("replay", "log"), ("producer", "replay"),
            ("producer", "log"), ("consumer", "log"), ("ops", "producer")} <= set(found)


@pytest.mark.parametrize("source,expected", [
    ("from hilo.consumer.site import Site", [(1, "consumer")]),
    ("import hilo.ops.cli", [(1, "ops")]),
    ("from hilo import log", [(1, "log")]),
    ("def f():\n    from hilo.producer import producer", [(2, "producer")]),
    ("from .base import Encoder\nimport torch", []),
])
def test_the_checker_reads_every_import_form(tmp_path, source, expected):
    f = tmp_path / "m.py"
    f.write_text(source)
    assert list(imported_layers(f)) == expected
