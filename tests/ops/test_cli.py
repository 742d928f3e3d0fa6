"""The `hilo` command as an operator uses it, on the embedded log."""
import json
import subprocess
import sys

import pytest

from hilo.ops.cli import main


def _help(*args):
    return subprocess.run([sys.executable, "-m", "hilo.ops.cli", *args, "--help"], capture_output=True, text=True, check=True).stdout


def test_help_lists_every_command_with_its_summary():
    from hilo.ops.cli import parser
    sub = next(a for a in parser()._actions if a.dest == "command")
    out = _help()
    for name, choice in sub.choices.items():  # the parser's own table, each with a one-line summary
        summary = next(a.help for a in sub._choices_actions if a.dest == name)
        assert summary and f"{name}" in out and summary[:40] in " ".join(out.split())
        assert choice.format_help()  # every subcommand builds its own --help


def test_codec_and_optimizer_choices_come_from_the_registries():
    from hilo.replica.codecs import CODECS
    from hilo.replica.optimizers import OPTIMIZERS
    out = _help("produce")
    assert "{" + ",".join(CODECS) + "}" in out and "{" + ",".join(OPTIMIZERS) + "}" in out
    assert f"default: {','.join(CODECS)}" in _help("bench", "codecs")


def test_produce_consume_lag_inspect(tmp_path, capsys):
    url, run = f"file://{tmp_path}/log", "cli-run"
    assert main(["topics", "create", "--log", url, "--run", run]) == 0
    assert "cli-run.updates: created" in capsys.readouterr().out
    assert main(["produce", "--log", url, "--run", run, "--steps", "4", "--codec", "spar", "--budget", "5%"]) == 0
    digest = capsys.readouterr().out.strip().splitlines()[-1].split()[-1]
    assert main(["consume", "--log", url, "--run", run, "--site", "x", "--state-dir", str(tmp_path / "x"),
                 "--until-version", "4", "--no-progress"]) == 0
    assert capsys.readouterr().out.strip() == f"x: v4 digest {digest}"
    assert main(["lag", "--log", url, "--run", run, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["site"], r["applied_version"], r["lag"], r["digest"]) for r in rows] == [("x", 4, 0, digest)]
    assert main(["lag", "--log", url, "--run", run]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == ["SITE", "APPLIED-VERSION", "SERVING-VERSION", "HEAD-VERSION", "LAG", "LAG-BYTES",
                                                               "CURRENT-OFFSET", "LOG-END-OFFSET", "LAST-APPLIED"]
    assert main(["inspect", "--log", url, "--run", run, "--version", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["version"] == 2 and d["codec"] == "spar" and d["blocks_sent"] == len(d["blocks"]) > 0
    assert all(b["k"] >= 1 and b["block"].endswith(("lora_A", "lora_B")) for b in d["blocks"])


def test_errors_are_one_clear_line(tmp_path, capsys):
    assert main(["lag", "--log", f"file://{tmp_path}/none", "--run", "nope"]) == 1
    assert "topic 'nope.updates' does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["produce", "--log", "file:///x", "--run", "r", "--budget", "lots"])
