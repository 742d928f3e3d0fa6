"""Reading what each site of a run last said about itself: its consumer group's committed position and metadata.

The metadata's format is schemas/site_report.py (SiteReport); the site writes it (consumer/site.py, `Site.commit`).
"""
from hilo.schemas.site_report import LINK_BPS, SiteReport  # noqa: F401  (LINK_BPS: the key, for readers of raw reports)

from .base import site_group, updates_topic


def site_reports(log, run: str) -> list:
    """(group, committed offset, SiteReport) per site group of `run` that has committed; unreadable fields are
    absent."""
    topic, prefix, out = updates_topic(run), site_group(run, ""), []
    for group in log.groups(prefix):
        c = log.committed(group, topic)
        if c is not None:
            out.append((group, c[0], SiteReport.from_json(c[1], group[len(prefix):])))
    return out
