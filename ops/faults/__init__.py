"""Fault injection: what the tests and benches install into a real site to show the rest of the system catches it
(lying sites: lies.py, started by lying_site.py). Nothing in the product imports it; the crash points, which the
product must pass itself, are schemas/crash_points.py."""
