"""What each site of a run last said about itself: the metadata of its consumer group's committed position.

A site commits its position with JSON metadata (consumer/site.py, `Site.commit`): its name, applied version and
digest, the log bytes through it, when it applied it (its wall clock), the version vLLM serves, and its link's
measured fetch throughput (LINK_BPS). `hilo lag` lays these out; `--budget auto` sizes messages by the slowest link.
"""
import json

from .base import site_group, updates_topic

LINK_BPS = "link_bps"  # bytes/s: median of the site's last multi-chunk fetches (replay/follower.py, Applied.transfer)


def site_reports(log, run: str) -> list:
    """(group, committed offset, metadata dict) per site group of `run` that has committed; unreadable metadata is {}."""
    topic, prefix, out = updates_topic(run), site_group(run, ""), []
    for group in log.groups(prefix):
        c = log.committed(group, topic)
        if c is None:
            continue
        offset, meta = c
        try:
            m = json.loads(meta or "{}")
        except json.JSONDecodeError:
            m = {}
        out.append((group, offset, m if isinstance(m, dict) else {}))
    return out
