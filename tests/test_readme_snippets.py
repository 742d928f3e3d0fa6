"""The trainer snippets in the docs are the code the training-loop tests run, word for word: the README's plain loop,
and docs/operations.md's frameworks, delta mode and rollout exchange."""
import pathlib
import re
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
# snippet name (`# README: name` in the tests) -> the page that shows it
HOMES = {"plain loop": "README.md", "transformers Trainer": "docs/operations.md",
         "TRL GRPOTrainer": "docs/operations.md",
         "delta mode": "docs/operations.md", "rollouts": "docs/operations.md", "audit": "docs/operations.md"}


def snippets() -> dict:
    """{name: dedented code} of every `# README: name` ... `# README: end` block in the training-loop tests."""
    src = "\n".join((ROOT / "tests" / f).read_text()
                    for f in ("producer/test_training_loops.py", "consumer/test_generate.py"))
    return {m.group(1): textwrap.dedent(m.group(2)).strip() for m in
            re.finditer(r"# README: (?!end)([^\n]+)\n(.*?)\n\s*# README: end", src, re.DOTALL)}


def test_every_snippet_is_in_its_page():
    found = snippets()
    assert set(found) == set(HOMES)
    for name, code in found.items():
        assert code in (ROOT / HOMES[name]).read_text(), (
            f"{HOMES[name]}'s {name!r} snippet differs from the test that runs it "
            "(tests/producer/test_training_loops.py, tests/consumer/test_generate.py)")
