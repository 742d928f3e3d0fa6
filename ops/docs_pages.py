"""The generated parts of the docs. `hilo docs` writes them; `hilo docs --check` and tests/ops/test_docs_pages.py
keep every page equal to what this module renders from docs/results/ and the code's own tables.

PAGES is the registry: page path -> render(root) -> the page's text. A renderer may build a whole page, or fill
the regions of a page whose prose is written by hand: each block between `<!-- hilo docs: NAME -->` and
`<!-- hilo docs: end -->` is replaced by REGIONS[NAME]'s output and everything else is kept as it stands. So a
table is written once, here, from the JSON the benchmark saved, and a person edits the prose around it.
"""
import json
import pathlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from hilo.schemas.errors import ConfigError

from . import cli_reference

ROOT = pathlib.Path(__file__).resolve().parents[1]  # the checkout this module runs from (an editable install)
RESULTS = "docs/results"
TRAINER_17B = f"{RESULTS}/trainer-qwen3-1.7b.json"  # `hilo bench trainer --shape qwen3-1.7b`
BEGIN = re.compile(r"^<!-- hilo docs: (?!end -->)(?P<name>[a-z0-9-]+) -->$", re.MULTILINE)
END = "<!-- hilo docs: end -->"


@dataclass(frozen=True)
class Region:
    """A generated block: its renderer and the result files it reads (relative to the root)."""

    render: Callable[[pathlib.Path], str]
    sources: tuple = ()


def _load(root: pathlib.Path, rel: str):
    """The JSON at root/rel; a missing or unreadable file is one line naming it."""
    path = root / rel
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"docs: cannot read {rel}: {e}") from None


# --- tables the benchmarks render themselves (ops/bench/*.py), read from their saved JSON ---------------------

def _codecs(rel: str) -> Region:
    def render(root):
        from hilo.ops.bench.codecs import table
        return table(_load(root, rel))
    return Region(render, (rel,))


def _bench(module: str, fn: str, rel: str) -> Region:
    """`hilo.ops.bench.MODULE.FN(json)`: the table the benchmark prints, from the JSON it saved."""
    def render(root):
        import importlib
        return getattr(importlib.import_module(f"hilo.ops.bench.{module}"), fn)(_load(root, rel))
    return Region(render, (rel,))


QUALITY = f"{RESULTS}/quality/quality.json"
PROTOCOL1 = f"{RESULTS}/quality/protocol1/quality.json"
H512 = f"{RESULTS}/quality-h512/quality.json"
PROBES = tuple(f"{RESULTS}/quality/probe/probe-rl-{sync}.json" for sync in ("spar4", "spar4-m98", "post"))


def probe_table(root: pathlib.Path) -> str:
    """The probe's tables of every method in one, a method column first (ops/bench/probe.py renders each)."""
    from hilo.ops.bench.probe import table
    out = []
    for rel in PROBES:
        res = _load(root, rel)
        lines = table(res).splitlines()
        if not out:
            out = ["| method " + lines[0], "|---" + lines[1]]
        out += [f"| {res['config']['sync']} " + line for line in lines[2:]]
    return "\n".join(out)


# --- tables no benchmark renders: small renderers of the saved JSON ------------------------------------------

def signing_table(root: pathlib.Path) -> str:
    """What Ed25519 costs per version at the Qwen3-1.7B shape: sign and verify time per codec's message."""
    rows = ["| codec | message bytes | sign ms | verify ms |", "|---|---:|---:|---:|"]
    for r in _load(root, f"{RESULTS}/codecs-compressed-budget.json")["rows"]:
        rows.append(f"| {r['codec']} | {r['bytes']:,} | {r['sign_ms']:.2f} | {r['verify_ms']:.2f} |")
    return "\n".join(rows)


def _kl_gain(cell: dict, full: dict, untrained: dict) -> float:
    """The share of full sync's held-out KL reduction a cell achieved (quality.table's "KL gain vs full")."""
    return (untrained["kl"] - cell["kl_mean"]) / (untrained["kl"] - full["kl_mean"])


def scale_table(root: pathlib.Path) -> str:
    """The larger student's spar4 cells against full sync, with the KL gain of the same cell at both shapes."""
    from hilo.ops.bench.quality import vs_full
    small, large = _load(root, QUALITY), _load(root, H512)

    def cells(res):
        return {(c["task"], c["optimizer"], c["sync"], c["budget"]): c for c in res["cells"]}
    s, big = cells(small), cells(large)
    rows = ["| task | optimizer | full pass@4 | spar4 @1.6% | KL gain vs full, small -> large |",
            "|---|---|---:|---:|---:|"]
    for (task, opt, sync, budget), c in big.items():
        if sync == "full":
            continue
        full, small_full, small_cell = (big[(task, opt, "full", None)], s[(task, opt, "full", None)],
                                        s[(task, opt, sync, budget)])
        gains = (_kl_gain(small_cell, small_full, small["untrained"]), _kl_gain(c, full, large["untrained"]))
        rows.append(f"| {task} | {opt} | {full['pass4_mean']:.3f} | {vs_full(c)} | {100 * gains[0]:.0f}% -> "
                    f"{100 * gains[1]:.0f}% |")
    return "\n".join(rows)


def serve_table(root: pathlib.Path) -> str:
    """Publish to first request served by the new version, per stage (medians of `hilo bench serve`)."""
    rows = ["| shape | LoRA params | adapter bf16 | publish s | apply s | export s | reload s | first request s | "
            "publish -> served s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in _load(root, f"{RESULTS}/serve.json")["shapes"]:
        m = s["median"]
        rows.append(f"| {s['shape']} r{s['rank']} | {s['lora_params']:,} | {s['adapter_bytes_bf16']:,} | "
                    f"{m['publish_s']:.3f} | {m['apply_s']:.3f} | {m['export_s']:.3f} | {m['reload_s']:.3f} | "
                    f"{m['first_s']:.3f} | {m['total_s']:.3f} |")
    return "\n".join(rows)


def faults_table(root: pathlib.Path) -> str:
    """Every SIGKILL of `hilo bench faults` by crash point, then what the history check found."""
    from hilo.schemas.crash_points import POINTS
    res = _load(root, f"{RESULTS}/faults.json")
    rows = ["| process | crash point | where it dies | SIGKILLs |", "|---|---|---|---:|"]
    for who, kills in (("trainer", res["trainer_kills"]), ("site", res["site_kills"])):
        for point, n in kills.items():
            rows.append(f"| {who} | `{point}` | {POINTS.get(point, 'a random instant')} | {n} |")
    found = (f"Versions published: {res['versions']:,}; trainer processes killed: "
             f"{sum(res['trainer_kills'].values())}, site processes killed: {sum(res['site_kills'].values())}; history "
             f"anomalies (gaps, duplicates, forks, acknowledged versions lost): {len(res['anomalies'])}; divergent "
             f"digests: {res['divergent_digests']} (trainer, killed site and late site end at "
             f"`{res['digests']['trainer'][:8]}...`); {res['trainer_s']:.0f} s of trainer kills, {res['sites_s']:.0f} "
             f"s of site kills.")
    return "\n".join(rows + ["", found])


def scrape_table(root: pathlib.Path) -> str:
    """`hilo bench scrape`: scrape latency of a catching-up site and how many scrapes disagreed with themselves."""
    r = _load(root, f"{RESULTS}/scrape.json")
    row = (f"| {r['shape']} | {r['versions']} | {r['every_ms']:.0f} | {r['scrapes']:,} | {r['p50_ms']:.1f} | "
           f"{r['p99_ms']:.1f} | {r['max_ms']:.0f} | {r['inconsistent']} | {r['target_p99_ms']:.0f} |")
    head = [
        "| shape | versions | scrape every ms | scrapes | p50 ms | p99 ms | max ms | inconsistent | p99 target ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    return "\n".join([*head, row])


def startup_table(root: pathlib.Path) -> str:
    """`python -m hilo.ops.bench.startup`: how long `hilo --help` takes now that only the named command is imported."""
    rows = ["| command | wall s | CPU s | speedup |", "|---|---:|---:|---:|"]
    for name, r in _load(root, f"{RESULTS}/startup.json")["cases"].items():
        rows.append(f"| {name} | {r['wall_s']:.3f} | {r['cpu_s']:.3f} | {r['speedup']:.0f}x |")
    return "\n".join(rows)


def measured_on_table(root: pathlib.Path) -> str:
    """Where each saved result was measured (its `measured_on`, ops/bench/machine.py); a file without one is an error.
    A results file merging runs (replay.json) has a row per run."""
    rows = ["| results | commit | code | recorded | cores | CPU model | triad GB/s |",
            "|---|---|---|---|---:|---|---:|"]
    code = {True: "uncommitted changes", False: "as committed"}
    for rel in sorted(s for s in sources() if s.endswith(".json")):
        res = _load(root, rel)
        runs = [(f"{rel[len(RESULTS) + 1:]} ({r['shape']})", r) for r in res.get("runs", []) if "measured_on" in r] \
            or [(rel[len(RESULTS) + 1:], res)]
        for name, r in runs:
            m = r.get("measured_on")
            if not isinstance(m, dict):
                raise ConfigError(f"docs: {rel} records no measured_on (the commit and machine it was measured on)")
            rows.append(f"| {name} | {m['commit'][:10]} | {code.get(m['dirty'], m['dirty'])} | {m['recorded']} | "
                        f"{m['cores']} | {m['cpu_model']} | {m['triad_gbps']} |")
    return "\n".join(rows)


def headline_table(root: pathlib.Path) -> str:
    """The README's few figures, each from the same JSON as its full table in docs/benchmarks.md."""
    cells = _load(root, QUALITY)["cells"]

    def gaps(sync):  # pass@4 minus full sync's in points, rounded as the tables print them, per pair at 1.6%
        return [round(100 * c["vs_full_pass4"]["diff"], 1) for c in cells if c["sync"] == sync and c["budget"] == 0.016]
    delta, grad = gaps("delta"), gaps("spar4")
    wan = {(r["method"], r["sites"], r["link_mbit"]): r for r in _load(root, f"{RESULTS}/wan.json")["rows"]}
    sent, full = wan[("spar4 1.6%", 4, 100)], wan[("full-adapter", 4, 100)]
    serve = {s["shape"]: s["median"]["total_s"] for s in _load(root, f"{RESULTS}/serve.json")["shapes"]}
    faults = _load(root, f"{RESULTS}/faults.json")
    replay = _load(root, f"{RESULTS}/replay.json")
    adamw = next(r for r in replay["rows"] if r["shape"] == "qwen3-1.7b" and r["optimizer"] == "adamw"
                 and r.get("apply", "kernel") == "kernel")  # what a site runs
    torch_path = next(r for r in replay["rows"] if r["shape"] == "qwen3-1.7b" and r["optimizer"] == "adamw"
                      and r.get("apply") == "reference")
    steps = {(r["trainer"], r["ranks"]): r["step_s"] for r in _load(root, TRAINER_17B)["rows"]}
    one, two = steps[("hilo, Kafka loopback, pipelined", 1)], steps[("hilo, Kafka loopback, pipelined", 2)]
    pace = _load(root, f"{RESULTS}/pace.json")
    rows = {  # what -> measured
        # the message, the trainer's encode and a site's apply, as `hilo bench replay` and `hilo bench pace` measured
        # them
        f"one version of a Qwen3-1.7B rank-64 adapter ({adamw['adapter_bytes_bf16'] / 1e6:.2f} MB in bf16), spar4 "
        f"codec":
            (f"{adamw['message_bytes'] / 1e6:.2f} MB "
             f"({100 * adamw['message_bytes'] / adamw['adapter_bytes_bf16']:.2f}%); encode "
             f"{pace['encode_median_s']:.2f} s, decode + AdamW step {adamw['stage_s_per_version']['apply']:.3f} s"),
        f"pass@4 against full sync at 1.6% per version, {len(delta)} task x optimizer pairs":
            (f"delta mode {min(delta):+.1f} to {max(delta):+.1f} points (within 1 on {sum(g >= -1 for g in delta)} of "
             f"{len(delta)}); gradient mode {min(grad):+.1f} to {max(grad):+.1f} (within 3 on "
             f"{sum(g >= -3 for g in grad)} of {len(grad)})"),
        "training step, 4 sites sharing a 100 Mbit/s uplink, 8 s of compute":
            (f"{sent['step_s']:.1f} s with spar4 at 1.6%, {full['step_s']:.1f} s shipping the adapter "
             f"({full['step_s'] / sent['step_s']:.1f}x)"),
        "publish to the first request vLLM serves with the new version (2-core CPU)":
            f"{serve['tiny']:.2f} s tiny model, {serve['qwen3-0.6b']:.2f} s Qwen3-0.6B r64",
        f"SIGKILLs at every crash point over {faults['versions']:,} versions":
            (f"{sum(faults['trainer_kills'].values())} trainers and {sum(faults['site_kills'].values())} sites killed: "
             f"{len(faults['anomalies'])} gaps, duplicates, forks or lost versions; {faults['divergent_digests']} "
             "divergent digests"),
        f"a site {adamw['versions']} versions behind catching up (Qwen3-1.7B r64, "
        f"AdamW)": f"{adamw['versions_per_s']:.2f} versions/s",
        "one Qwen3-1.7B r64 AdamW version applied by a site (decode, step, NaN/Inf check, digest)":
            (f"{adamw['stage_s_per_version']['apply']:.3f} s on the fused kernel, "
             f"{torch_path['stage_s_per_version']['apply']:.3f} s on the torch path it must equal "
             f"({adamw['apply_over_floor']:.1f}x the memory-bandwidth floor at "
             f"{next(r for r in replay['runs'] if r['shape'] == 'qwen3-1.7b')['triad_gbps']:.0f} GB/s)"),
        f"a site following a run that gains a Qwen3-1.7B r64 AdamW version every {pace['interval_s']:g} s "
        f"({pace['versions']} versions)":
            (f"at most {pace['behind_max']} version(s) behind; freshness p50 {pace['freshness_p50_s']:.2f} s, p99 "
             f"{pace['freshness_p99_s']:.2f} s; trainer's encode {pace['encode_median_s']:.2f} s per version"),
        "a 2-rank trainer's optimizer step against a lone one's (torchrun, Qwen3-1.7B r64, Kafka, pipelined)":
            (f"{two:.2f} s against {one:.2f} s ({two / one:.2f}x); in line "
             f"{steps[('hilo, Kafka loopback', 2)] / steps[('hilo, Kafka loopback', 1)]:.2f}x"),
    }
    return "\n".join(["| what | measured |", "|---|---|"]
                     + [f"| {what} | {measured} |" for what, measured in rows.items()])


def acls_table(root: pathlib.Path) -> str:
    """The Kafka ACLs `hilo acls grant` creates for a run (`GRANTS` in ops/acls.py), for a run named exp1."""
    from hilo.ops.acls import acls_for
    rows = ["| principal | resource | operations |", "| --- | --- | --- |"]
    for role in ("trainer", "site"):
        ops = {}  # (resource type, name, pattern) -> operations, in the table's order
        for acl in acls_for("exp1", role, f"User:{role}"):
            rp = acl.resource_pattern
            ops.setdefault((rp.resource_type.name, rp.resource_name, rp.pattern_type.name),
                           []).append(acl.operation.name)
        for (kind, name, pattern), names in ops.items():
            what = f"{kind.lower().replace('_', ' ')} `{name}`" + (" (prefixed)" if pattern == "PREFIXED" else "")
            rows.append(f"| {role} | {what} | {', '.join(n.title().replace('_', '') for n in names)} |")
    return "\n".join(rows)


def doctor_table(root: pathlib.Path) -> str:
    """`hilo doctor`'s checks (the registry CHECKS in ops/doctor/__init__.py): what each needs and what it checks."""
    from hilo.ops.doctor import CHECKS
    rows = ["| check | runs with | checks |", "| --- | --- | --- |"]
    for c in CHECKS:
        given = ", ".join("a kafka:// `--log`" if n == "kafka" else f"`--{n.replace('_', '-')}`"
                          for n in c.needs) or "always"
        rows.append(f"| `{c.name}` | {given} | {c.about} |")
    return "\n".join(rows)


def metrics_table(root: pathlib.Path) -> str:
    """Every exported metric (schemas/metrics.py is the one list of names)."""
    from hilo.schemas.metrics import markdown_table
    return markdown_table()


REGIONS = {
    "headline": Region(headline_table,
                       (QUALITY, f"{RESULTS}/wan.json", f"{RESULTS}/serve.json", f"{RESULTS}/faults.json",
                                        f"{RESULTS}/replay.json", TRAINER_17B, f"{RESULTS}/pace.json")),
    "metrics": Region(metrics_table),
    "acls": Region(acls_table),
    "doctor": Region(doctor_table),
    "codecs": _codecs(f"{RESULTS}/codecs.json"),
    "codecs-compressed-budget": _codecs(f"{RESULTS}/codecs-compressed-budget.json"),
    "signing": Region(signing_table, (f"{RESULTS}/codecs-compressed-budget.json",)),
    "quality-summary": _bench("quality", "summary", QUALITY),
    "quality-fidelity": _bench("quality", "fidelity", QUALITY),
    "quality-probe": Region(probe_table, PROBES),
    "quality-cells": _bench("quality", "table", QUALITY),
    "protocol1-summary": _bench("quality", "summary", PROTOCOL1),
    "protocol1-fidelity": _bench("quality", "fidelity", PROTOCOL1),
    "protocol1-cells": _bench("quality", "table", PROTOCOL1),
    "quality-scale": Region(scale_table, (QUALITY, H512)),
    "serve": Region(serve_table, (f"{RESULTS}/serve.json",)),
    "faults": Region(faults_table, (f"{RESULTS}/faults.json",)),
    "fuzz": _bench("fuzz", "table", f"{RESULTS}/fuzz.json"),
    "fanout": _bench("fanout", "table", f"{RESULTS}/fanout.json"),
    "rl": _bench("rl", "table", f"{RESULTS}/rl.json"),
    "audit": _bench("audit", "table", f"{RESULTS}/audit.json"),
    "audit-served": _bench("audit", "served_markdown", f"{RESULTS}/audit-served.json"),
    "replay": _bench("replay", "table", f"{RESULTS}/replay.json"),
    "wan": _bench("wan", "markdown", f"{RESULTS}/wan.json"),
    "scrape": Region(scrape_table, (f"{RESULTS}/scrape.json",)),
    "snapshot": _bench("snapshot", "table", f"{RESULTS}/snapshot.json"),
    "pace": _bench("pace", "table", f"{RESULTS}/pace.json"),
    "ranks": _bench("ranks", "table", f"{RESULTS}/ranks.json"),
    "ranks-4": _bench("ranks", "table", f"{RESULTS}/ranks-qwen3-0.6b/ranks.json"),
    "trainer": _bench("trainer", "table", f"{RESULTS}/trainer.json"),
    "trainer-qwen3": _bench("trainer", "table", TRAINER_17B),
    "trainer-qwen3-8b": _bench("trainer", "table", f"{RESULTS}/trainer-qwen3-8b/trainer.json"),
    "trainer-wan": _bench("trainer", "table", f"{RESULTS}/trainer-wan/trainer.json"),
    "startup": Region(startup_table, (f"{RESULTS}/startup.json",)),
    "measured-on": Region(measured_on_table),  # reads every file the other regions read
}


def fill(text: str, names: tuple, root: pathlib.Path, page: str = "page") -> str:
    """`text` with each `hilo docs` region rendered afresh; a region missing, unknown, repeated or unclosed is an
    error."""
    out, pos, seen = [], 0, []
    for m in BEGIN.finditer(text):
        name = m["name"]
        if name not in names:
            raise ConfigError(f"docs: {page} has a region {name!r} it does not generate (its regions: "
                              f"{', '.join(names)})")
        if name in seen:
            raise ConfigError(f"docs: {page} has the region {name!r} twice")
        if m.start() < pos:
            raise ConfigError(f"docs: {page}: region {name!r} starts inside region {seen[-1]!r}")
        end = text.find("\n" + END, m.end())
        if end < 0:
            raise ConfigError(f"docs: {page}: region {name!r} has no {END!r} line after it")
        seen.append(name)
        out += [text[pos:m.end()], "\n\n", REGIONS[name].render(root).strip("\n"), "\n\n"]
        pos = end + 1
    missing = [n for n in names if n not in seen]
    if missing:
        raise ConfigError(f"docs: {page} lacks the region(s) {', '.join(missing)}: add `<!-- hilo docs: NAME -->` and "
                          f"`{END}` lines where each goes")
    return "".join(out) + text[pos:]


def regions(page: str, *names: str) -> Callable[[pathlib.Path], str]:
    """A renderer of `page` that keeps its prose and renders the regions `names` (each must be in the page once)."""
    unknown = [n for n in names if n not in REGIONS]
    assert not unknown, unknown  # a typo in PAGES below

    def render(root: pathlib.Path) -> str:
        path = root / page
        if not path.is_file():
            raise ConfigError(f"docs: {page} is missing: its prose and region markers are the template `hilo docs` "
                              f"fills")
        return fill(path.read_text(), names, root, page)
    render.regions = names
    return render


BENCHMARKS = ("codecs", "codecs-compressed-budget", "signing", "quality-summary", "quality-fidelity", "quality-probe",
              "quality-cells", "protocol1-summary", "protocol1-fidelity", "protocol1-cells", "quality-scale", "serve",
              "faults", "fuzz",
              "fanout", "rl", "audit", "audit-served", "replay", "snapshot", "pace", "wan", "ranks", "ranks-4",
              "trainer", "trainer-qwen3", "trainer-qwen3-8b", "trainer-wan", "scrape",
              "startup", "measured-on")

# page -> render(root) -> text. A generated page of its own (docs/cli.md, say) is one more entry whose renderer
# returns the whole text.
PAGES = {
    "README.md": regions("README.md", "headline"),
    "docs/operations.md": regions("docs/operations.md", "doctor", "acls", "metrics"),
    "docs/benchmarks.md": regions("docs/benchmarks.md", *BENCHMARKS),
    "docs/cli.md": cli_reference.markdown,
}


def sources(pages: dict = PAGES) -> set:
    """Every result file some page's regions read (relative to the root)."""
    return {s for render in pages.values() for n in getattr(render, "regions", ()) for s in REGIONS[n].sources}


def stale(root: pathlib.Path = ROOT, pages: dict = PAGES) -> dict:
    """{page: its text as generated} for every page whose file differs from it (or is missing)."""
    out = {}
    for page, render in pages.items():
        want, path = render(root), root / page
        if not path.is_file() or path.read_text() != want:
            out[page] = want
    return out


def write(root: pathlib.Path = ROOT, pages: dict = PAGES) -> list:
    """Write every page that differs from what its renderer produces; returns the pages written."""
    changed = stale(root, pages)
    for page, text in changed.items():
        (root / page).parent.mkdir(parents=True, exist_ok=True)
        (root / page).write_text(text)
    return list(changed)
