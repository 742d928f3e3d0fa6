"""`--budget auto`: sites at the head measure what their link delivers and report it with their position; the
trainer gives each version the bytes the slowest recent site receives in its share of the step time."""
import json

import pytest

from hilo.log import open_log, site_group, updates_topic
from hilo.log.site_reports import LINK_BPS, site_reports
from hilo.log.tail import last_message
from hilo.producer.link_budget import LinkBudget, cpu_slope
from hilo.replica.codecs import AutoBudget
from hilo.producer.producer import HiLoProducer
from hilo.schemas.errors import ConfigError
from hilo.schemas.records import decode_record
from tests.conftest import KAFKA_URL, new_run, producer_config, publish_random, small_model
from tests.helpers import hilo, reaped, wait_until

MB = 1_000_000


def _report(log, run, site, **meta):
    """A position committed with metadata, as a site commits it."""
    log.commit(site_group(run, site), updates_topic(run), 0, json.dumps({"site": site, "version": 1} | meta))


def test_the_slowest_recent_site_gets_its_share_of_the_step_time_within_floor_and_ceiling(tmp_path):
    log, run = open_log(f"file://{tmp_path}/log"), new_run("rule")
    log.create_topics(run)
    wall = 1_000_000.0
    _report(log, run, "fast", applied_at=wall - 1, **{LINK_BPS: 50 * MB})
    _report(log, run, "slow", applied_at=wall - 2, **{LINK_BPS: 2 * MB})
    _report(log, run, "gone", applied_at=wall - 3600, **{LINK_BPS: 1000})   # applied nothing for an hour: left
    _report(log, run, "silent", applied_at=wall)                             # no measurement yet
    _report(log, run, "odd", applied_at=wall, **{LINK_BPS: "fast"})          # not a number: ignored
    now = [100.0]
    rule = LinkBudget(AutoBudget(start=0.02, share=0.5, floor=0.001, ceiling=0.5, refresh_s=0), log, run,
                      adapter_bytes=10 * MB, clock=lambda: now[0], wall=lambda: wall)
    budget, why = rule.choose()
    assert budget.fraction == 0.02 and why == {"rule": "start", "reason": "first step", "fraction": 0.02}
    now[0] += 4.0
    budget, why = rule.choose()   # 0.5 of a 4 s step at 2 MB/s: 4 MB, 40% of the 10 MB adapter
    assert why == {"rule": "link", "site": "slow", "link_bps": 2 * MB, "step_s": 4.0, "share": 0.5, "fraction": 0.4}
    assert budget.fraction == pytest.approx(0.4)
    now[0] += 40.0
    budget, why = rule.choose()   # the median step is now 22 s: 22 MB wanted, the ceiling is 5 MB
    assert why["rule"] == "ceiling" and budget.fraction == 0.5
    _report(log, run, "slow", applied_at=wall, **{LINK_BPS: 1000})           # a site behind a very slow link
    now[0] += 4.0
    budget, why = rule.choose()
    assert why["rule"] == "floor" and why["site"] == "slow" and budget.fraction == 0.001


def test_on_a_fast_link_the_trainers_cpu_per_fraction_holds_the_budget_back(tmp_path):
    log, run = open_log(f"file://{tmp_path}/log"), new_run("cpu")
    log.create_topics(run)
    wall = 1_000_000.0
    _report(log, run, "near", applied_at=wall, **{LINK_BPS: 55 * MB})  # 1 Gbit/s as a site measures it
    now = [0.0]
    rule = LinkBudget(AutoBudget(share=0.05, refresh_s=0), log, run, adapter_bytes=139 * MB,
                      clock=lambda: now[0], wall=lambda: wall)
    rule.choose()
    for cpu_s in (1.9, 2.0, 1.95):  # every version so far at the start budget: no slope can be told
        rule.observe(0.016, cpu_s)
        now[0] += 10.0
        budget, why = rule.choose()
    assert "cpu_s_per_fraction" not in why and budget.fraction == pytest.approx(0.05 * 10 * 55 / 139)  # link only: 20%
    assert cpu_slope(rule.cpu) is None
    rule.observe(budget.fraction, 1.95 + 21 * (budget.fraction - 0.016))  # encoding 20% cost 4.2 s more
    now[0] += 10.0
    budget, why = rule.choose()
    assert why["cpu_s_per_fraction"] == pytest.approx(21, rel=1e-3)
    assert budget.fraction == pytest.approx(0.05 * 10 / (139 / 55 + 21))  # 2.1%: the bytes' CPU counts too
    assert why["rule"] == "link" and why["fraction"] == pytest.approx(budget.fraction, abs=1e-6)


def test_a_versions_budget_can_be_recomputed_from_its_meta_when_steps_take_milliseconds(tmp_path):
    log, run = open_log(f"file://{tmp_path}/log"), new_run("ms")
    log.create_topics(run)
    wall = 1_000_000.0
    _report(log, run, "near", applied_at=wall, **{LINK_BPS: 55 * MB})
    now = [0.0]
    rule = LinkBudget(AutoBudget(share=0.5, refresh_s=0, floor=1e-4), log, run, adapter_bytes=MB, clock=lambda: now[0],
                      wall=lambda: wall)
    rule.choose()
    for fraction in (0.016, 0.016, 0.05):  # a 12.34 ms step; encoding costs 0.01234 s per unit of budget
        rule.observe(fraction, 0.002 + 0.01234 * fraction)
        now[0] += 0.01234
        _, why = rule.choose()
    cost_s = MB / why["link_bps"] + why["cpu_s_per_fraction"]
    assert why["fraction"] == pytest.approx(why["share"] * why["step_s"] / cost_s, rel=1e-3), why


def test_a_producer_tells_the_rule_what_each_version_cost_its_cpu(tmp_path):
    run = new_run("cpu-producer")
    budget = AutoBudget(start=0.5, floor=0.1, ceiling=1.0)
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=f"file://{tmp_path}/log", budget=budget))
    publish_random(producer, 3)
    assert [f for f, _ in producer.link_budget.cpu] == [0.5] * 3  # no site reports on the file log: the start budget
    assert producer.link_budget.cpu[-1][1] == producer.last_step["encode_s"] + producer.last_step["apply_s"] > 0
    producer.close()


def test_without_any_report_the_budget_is_the_start_and_bad_settings_name_the_field(tmp_path):
    log, run = open_log(f"file://{tmp_path}/log"), new_run("none")
    log.create_topics(run)
    rule = LinkBudget(AutoBudget(start=0.05, refresh_s=0), log, run, adapter_bytes=MB)
    assert rule.choose()[1]["reason"] == "no site has reported its link yet"
    assert rule.choose()[0].fraction == 0.05
    for bad, field in (({"share": 0}, "share"), ({"start": 0.5, "ceiling": 0.25}, "start"), ({"floor": 0}, "floor")):
        with pytest.raises(ConfigError, match=rf"AutoBudget\.{field} = "):
            AutoBudget(**bad)


@pytest.mark.kafka
def test_sites_at_the_head_report_their_link_and_each_version_says_how_its_budget_was_chosen(tmp_path, logs):
    run = new_run("auto")
    producer = HiLoProducer.open(small_model(), producer_config(
        run=run, log=KAFKA_URL, budget=AutoBudget(start=0.25, share=0.5, floor=0.1, ceiling=2.0, refresh_s=0)))
    publish_random(producer, 3)
    log = logs(KAFKA_URL)

    def reports():
        return {r.site: r for _, _, r in site_reports(log, run)}

    procs = {}
    with reaped(procs):
        for s in ("a", "b"):  # they catch up on v1..v3 first: nothing they read then was at the head
            procs[s] = hilo("consume", "--log", KAFKA_URL, "--run", run, "--site", s, "--state-dir", str(tmp_path / s),
                            "--no-export", "--no-progress", "--snapshot-every", "100")
        wait_until(lambda: all(r.version == 3 for r in reports().values()) and len(reports()) == 2, 120,
                   "both sites at v3")
        assert not any(r.link_bps for r in reports().values())  # catching up measures no link
        for v in range(4, 8):  # one version at a time, each read by sites waiting at the head
            publish_random(producer, 1, seed=v)
            wait_until(lambda v=v: all(r.version == v for r in reports().values()), 60, f"both sites at v{v}")
        links = {s: r.link_bps for s, r in reports().items()}
        assert set(links) == {"a", "b"} and all(bps > 0 for bps in links.values()), links
        publish_random(producer, 1, seed=8)
        data = last_message(log, updates_topic(run), run).data
        meta, adapter = decode_record(data, "v8").meta, producer.manifest.adapter_bytes()
        assert meta["budget_rule"] in ("link", "ceiling") and meta["budget_site"] in links
        # the codec kept to it
        assert 0.1 <= meta["budget_fraction"] <= 2.0 and len(data) <= meta["budget_fraction"] * adapter
        if meta["budget_rule"] == "link":  # the CPU term once it is fitted
            cost_s = adapter / meta["budget_link_bps"] + meta.get("budget_cpu_s_per_fraction", 0.0)
            assert meta["budget_fraction"] == pytest.approx(meta["budget_share"] * meta["budget_step_s"] / cost_s,
                                                            rel=1e-2)
        wait_until(lambda: all(r.digest == producer.replica.digest.hex() for r in reports().values()), 60,
                   "both sites at the trainer's digest")
    producer.close()
