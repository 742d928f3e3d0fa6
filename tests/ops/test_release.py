"""The release number, the changelog and the versions a replica's bits depend on say the same thing
(CHANGELOG.md, "Versioning")."""
import pathlib
import re
import tomllib

from hilo.ops.cli import version_line
from hilo.schemas.framing import SCHEMA_VERSION
from hilo.schemas.records import DIGEST_VERSION, MATH_VERSION

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _releases() -> list:
    """(version, body) of each released entry of CHANGELOG.md, newest first."""
    text = (ROOT / "CHANGELOG.md").read_text()
    parts = re.split(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}\n", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2]))


def test_the_newest_changelog_entry_is_the_version_in_pyproject():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert _releases()[0][0] == version


def test_the_newest_entry_names_the_formats_this_code_writes():
    body = _releases()[0][1].strip()
    assert body.startswith(f"Writes wire format {SCHEMA_VERSION}, arithmetic {MATH_VERSION}, state digest "
                           f"{DIGEST_VERSION}."), body[:120]


def test_spec_is_titled_with_the_wire_format_version_the_code_writes():
    title = (ROOT / "schemas" / "SPEC.md").read_text().splitlines()[0]
    assert title == f"# hilo-sync wire format, schema version {SCHEMA_VERSION}"


def test_version_line_names_every_version():
    line = version_line()
    assert f"wire format {SCHEMA_VERSION}, arithmetic {MATH_VERSION}, state digest {DIGEST_VERSION}" in line
