"""A site's committed report is parsed once, by one rule: a field of the wrong type is absent, never an error."""
import json

from hilo.schemas.site_report import SiteReport


def test_a_report_round_trips_and_leaves_out_what_is_not_set():
    r = SiteReport("eu-1", 7, "ab" * 16, 1234, 1700000000.5, None, 5e6)
    text = r.to_json()
    assert "serving_version" not in json.loads(text) and SiteReport.from_json(text, "ignored") == r


def test_garbled_fields_are_absent_and_the_site_name_falls_back_to_the_group():
    text = json.dumps({"version": "7", "digest": 5, "log_bytes": True, "applied_at": "now", "serving_version": 2.5,
                       "link_bps": -3})
    assert SiteReport.from_json(text, "from-group") == SiteReport("from-group")


def test_metadata_that_is_not_json_or_not_an_object_is_an_empty_report():
    for text in ("{not json", "[1, 2]", None, ""):
        assert SiteReport.from_json(text, "s") == SiteReport("s")
