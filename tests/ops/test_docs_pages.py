"""The docs: every generated page is what ops/docs_pages.py renders (a table edited by hand, or a result saved
without `hilo docs`, fails here), the README stays a short way in, and every relative link lands."""
import json
import pathlib
import re
import shutil

import pytest
from hilo.ops import docs_pages
from hilo.ops.cli import main
from hilo.schemas.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]
README_MAX_LINES = 350
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", sorted(docs_pages.PAGES))
def test_each_page_is_what_its_generator_writes(page):
    assert (ROOT / page).read_text() == docs_pages.PAGES[page](ROOT), (
        f"{page} differs from what `hilo docs` writes (a table edited by hand, or results saved without regenerating): "
        "run `hilo docs`")


def test_every_saved_result_is_rendered():
    saved = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "results").rglob("*.json")}
    assert saved - docs_pages.sources() == set(), "results no page renders: add a region (ops/docs_pages.py REGIONS)"
    assert {s for s in docs_pages.sources() if not (ROOT / s).is_file()} == set()


def test_every_saved_result_says_where_it_was_measured():
    """Each results file names the commit and the machine (what nobody recorded is "unknown", never a guess)."""
    for path in (ROOT / "docs" / "results").rglob("*.json"):
        m = json.loads(path.read_text()).get("measured_on")
        assert isinstance(m, dict) and {"commit", "dirty", "recorded", "cores", "cpu_model",
                                        "triad_gbps"} <= set(m), path
        assert re.fullmatch(r"[0-9a-f]{40}", m["commit"]) and m["recorded"] in ("at run", "git log"), (path, m)


def test_the_headline_quotes_the_newest_results_of_a_version():
    """The README's first row (a 1.7B spar4 version: encode, decode + AdamW step) is the replay and pace benchmarks'
    (was: the codecs table's, measured before the fused kernels: 0.73 s and 0.72 s)."""
    replay, pace = (json.loads((ROOT / "docs" / "results" / f"{n}.json").read_text()) for n in ("replay", "pace"))
    site = next(r for r in replay["rows"]
                if (r["shape"], r["optimizer"], r["apply"]) == ("qwen3-1.7b", "adamw", "kernel"))
    first = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| one version of"))
    assert (f"encode {pace['encode_median_s']:.2f} s, decode + AdamW step "
            f"{site['stage_s_per_version']['apply']:.3f} s") in first


@pytest.fixture
def checkout(tmp_path):
    """A copy of the pages and of the results they read (the runs and plots left out)."""
    for page in docs_pages.PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    for src in docs_pages.sources():
        (tmp_path / src).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / src, tmp_path / src)
    return tmp_path


def test_check_names_a_stale_page_and_docs_rewrites_it(checkout, capsys):
    page = checkout / "docs" / "benchmarks.md"
    text = page.read_text()
    page.write_text(text.replace("| tiny r16 | 262,144 |", "| tiny r16 | 262,145 |"))  # a table edited by hand
    assert main(["docs", "--check", "--root", str(checkout)]) == 1
    err = capsys.readouterr().err
    assert "docs/benchmarks.md" in err and "README.md" not in err and len(err.strip().splitlines()) == 1
    assert main(["docs", "--root", str(checkout)]) == 0
    assert "wrote docs/benchmarks.md" in capsys.readouterr().out and page.read_text() == text
    assert main(["docs", "--check", "--root", str(checkout)]) == 0


def test_a_new_result_shows_in_its_table(checkout, capsys):
    results = checkout / "docs" / "results" / "scrape.json"
    results.write_text(results.read_text().replace('"p99_ms": 37.79', '"p99_ms": 41.5'))
    assert main(["docs", "--check", "--root", str(checkout)]) == 1
    assert "docs/benchmarks.md" in capsys.readouterr().err
    assert main(["docs", "--root", str(checkout)]) == 0
    assert "| 41.5 |" in (checkout / "docs" / "benchmarks.md").read_text()


@pytest.mark.parametrize("text,error", [
    ("a\n<!-- hilo docs: scrape -->\nx\n", "no '<!-- hilo docs: end -->' line"),
    ("a\n", "lacks the region"),
    ("<!-- hilo docs: nope -->\n<!-- hilo docs: end -->\n", "region 'nope' it does not generate"),
])
def test_regions_that_cannot_be_filled_are_one_line(checkout, text, error):
    with pytest.raises(ConfigError, match=re.escape(error)):
        docs_pages.fill(text, ("scrape",), checkout)


def test_the_readme_is_a_way_in():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (f"README.md has {len(lines)} lines; at most {README_MAX_LINES} (details go "
                                            f"in docs/)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE))


def _anchors(page: pathlib.Path) -> set:
    """GitHub's heading anchors of a markdown page."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", page.read_text(), flags=re.DOTALL | re.MULTILINE),
                       re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page",
                         ["README.md"] + sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")))
def test_every_relative_link_lands(page):
    src = ROOT / page
    bad = []
    for target in LINK.findall(_prose(src.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (src.parent / path).resolve() if path else src
        if not dest.is_relative_to(ROOT):
            bad.append(f"{target} (outside the repository)")
        elif not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target} (no heading #{anchor} there)")
    assert bad == [], f"{page}: " + "; ".join(bad)
