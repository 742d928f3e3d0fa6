"""What a site says about itself: the metadata of its consumer group's committed position (SPEC.md, "Site reports").

A site commits its position with this JSON: its name, applied version and digest, the log bytes through it, when it
applied it (its wall clock), the version vLLM serves, and its link's measured throughput. `hilo lag` lays these out,
`--budget auto` sizes messages by the slowest link, and a restarting trainer checks that no site is ahead of it.
Anyone who can commit to the group can write anything there: a field that does not parse is absent, never an error.
"""
import json
import math
from dataclasses import asdict, dataclass

LINK_BPS = "link_bps"  # bytes/s: median of the site's last multi-chunk fetches (replay/follower.py, Applied.delivery)


def _int(v, default=None):
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _number(v):
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


@dataclass(frozen=True)
class SiteReport:
    """One site's report; version -1: none applied (or unreadable), None: not reported."""

    site: str
    version: int = -1
    digest: str | None = None
    log_bytes: int = 0
    applied_at: float | None = None
    serving_version: int | None = None
    link_bps: float | None = None

    def to_json(self) -> str:
        """The committed metadata: compact, without fields that are not set."""
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None, site: str) -> "SiteReport":
        """Parse committed metadata; `site`: the name when the report gives none (the group's suffix)."""
        try:
            m = json.loads(text or "{}")
        except ValueError:
            m = {}
        m = m if isinstance(m, dict) else {}
        bps = _number(m.get(LINK_BPS))
        return cls(site=m["site"] if isinstance(m.get("site"), str) else site, version=_int(m.get("version"), -1),
                   digest=m["digest"] if isinstance(m.get("digest"), str) else None,
                   log_bytes=_int(m.get("log_bytes"), 0),
                   applied_at=_number(m.get("applied_at")), serving_version=_int(m.get("serving_version")),
                   link_bps=bps if bps is not None and bps > 0 else None)
