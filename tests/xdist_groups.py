"""`--dist loadgroup` that groups: every test of one `xdist_group` runs on one pytest-xdist worker, one after another.

pytest-xdist 3.8 groups by renaming each test's nodeid to `NODEID@GROUP` (item._nodeid) in the worker; pytest 9 keeps
a node's id elsewhere (item._id), so the rename does nothing and tests of one group were spread over workers (two
modules' fixed-port brokers, or two vLLM tests, collided). Here the controller's scheduler finds a test's group
itself, from the source of its module (read once per module, with `ast`):
- `pytestmark = [..., pytest.mark.xdist_group("NAME")]` at module level groups the whole module;
- `@pytest.mark.xdist_group("NAME")` on a test function or class groups that test (or class);
- a module or test marked `vllm` and no group is in group "vllm" (every test of the shared vLLM server runs on one
  worker: they share adapter names, its two LoRA slots and its CPU).
Tests without a group are spread one by one (xdist's `load`). Each worker checks, after collection, that every
test's marks give the group this reading gives (a group set some other way, say by a fixture or a hook, is an
error at collection, not a silent collision).
"""
import ast
import functools
import pathlib

import pytest


def _marks(node) -> list:
    """(mark name, first argument or None) of every `pytest.mark.NAME` / `pytest.mark.NAME(ARG)` under `node`."""
    out = []
    for n in ast.walk(node):
        call = n if isinstance(n, ast.Call) else None
        attr = call.func if call is not None else n
        if isinstance(attr, ast.Attribute) and isinstance(attr.value, ast.Attribute) and attr.value.attr == "mark":
            arg = call.args[0].value if call is not None and call.args and isinstance(call.args[0],
                                                                                      ast.Constant) else None
            out.append((attr.attr, arg))
    return out


def _named(marks: list) -> str | None:
    """The group an `xdist_group` mark among `marks` names, if any."""
    return next((arg for name, arg in marks if name == "xdist_group"), None)


def _vllm(marks: list) -> bool:
    return any(name == "vllm" for name, _ in marks)


@functools.cache
def groups_in(path: pathlib.Path) -> tuple:
    """(the group the module's pytestmark names, whether it marks vllm, {test function or class name: the group its own
    marks name}, {names whose own marks say vllm}) read from the source at `path`."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError):
        return None, False, {}, set()
    module, module_vllm, own, own_vllm = None, False, {}, set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            marks = _marks(node.value)
            module, module_vllm = _named(marks), _vllm(marks)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            marks = [m for d in node.decorator_list for m in _marks(d)]
            if _named(marks) is not None:
                own[node.name] = _named(marks)
            if _vllm(marks):
                own_vllm.add(node.name)
    return module, module_vllm, own, own_vllm


def group_of(rootpath: pathlib.Path, nodeid: str) -> str | None:
    """The xdist group of the test `nodeid` (None: none): the group its own marks name, else its module's, else "vllm"
    for a test marked vllm. An `@GROUP` suffix (xdist's rename, where it works) is dropped."""
    path, _, rest = nodeid.rsplit("@", 1)[0].partition("::")
    module, module_vllm, own, own_vllm = groups_in(rootpath / path)
    name = rest.split("::", 1)[0].split("[", 1)[0]
    return own.get(name) or module or ("vllm" if module_vllm or name in own_vllm else None)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadgroup`: xdist's loadgroup scheduler with the groups read here."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SourceGroups(LoadScopeScheduling):
        """A unit of work per group, and per ungrouped test; the biggest groups are handed out first."""

        def _split_scope(self, nodeid: str) -> str:
            group = group_of(config.rootpath, nodeid)
            return f"group {group}" if group is not None else nodeid

    return SourceGroups(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Every test's marks give the group the scheduler reads from its source; a test where they do not fails (at setup,
    so a worker reports it like any failure)."""
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        marked = (mark.args[0] if mark.args
                  else mark.kwargs.get("name")) if mark else ("vllm" if item.get_closest_marker("vllm") else None)
        read = group_of(config.rootpath, item.nodeid)
        if marked != read:
            item._hilo_group_error = (f"{item.nodeid}: marked for xdist group {marked!r}, its source says {read!r}: "
                                      f"write the group as a mark in the test's module (tests/xdist_groups.py)")


def pytest_runtest_setup(item):
    error = getattr(item, "_hilo_group_error", None)
    if error:
        pytest.fail(error, pytrace=False)
