"""README's "Use it from your trainer" snippets are the code the training-loop tests run, word for word."""
import pathlib
import re
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]


def snippets() -> dict:
    """{name: dedented code} of every `# README: name` ... `# README: end` block in the training-loop tests."""
    src = "\n".join((ROOT / "tests" / f).read_text() for f in ("producer/test_training_loops.py", "consumer/test_generate.py"))
    return {m.group(1): textwrap.dedent(m.group(2)).strip() for m in
            re.finditer(r"# README: (?!end)([^\n]+)\n(.*?)\n\s*# README: end", src, re.S)}


def test_every_snippet_is_in_the_readme():
    found = snippets()
    assert set(found) == {"plain loop", "transformers Trainer", "TRL GRPOTrainer", "delta mode", "rollouts"}
    readme = (ROOT / "README.md").read_text()
    for name, code in found.items():
        assert code in readme, f"README's {name!r} snippet differs from the test that runs it (tests/producer/test_training_loops.py, tests/consumer/test_generate.py)"
