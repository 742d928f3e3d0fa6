"""What an operator scrapes: real `hilo consume` processes and a real trainer, read with prometheus_client's own
parser over HTTP, compared with the truth read from the log."""
import contextlib
import json
import os
import pathlib
import re
import signal
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hilo.log import updates_topic
from hilo.log.tail import head, records
from hilo.ops.metrics_server import MetricsConfig, MetricsServer
from hilo.producer.producer import HiLoProducer
from hilo.schemas import headers as H
from hilo.schemas.chunks import split
from hilo.schemas.errors import ConfigError, FencedError
from hilo.schemas.metrics import TABLE, Metrics, markdown_table
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import hilo, open_site, wait_for_line, wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGES = ("fetch", "verify", "decode", "apply")


def get(url: str) -> tuple:
    """(HTTP status, body) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(url: str) -> dict:
    """{(sample name, frozenset of labels without run/site): value} of one scrape, parsed by prometheus_client."""
    out = {}
    for family in text_string_to_metric_families(get(url + "/metrics")[1]):
        for s in family.samples:
            labels = frozenset((k, v) for k, v in s.labels.items() if k not in ("run", "site"))
            out[(s.name, labels)] = s.value
    return out


def families(url: str) -> set:
    """Names of the metric families one scrape shows (labelled metrics with no sample yet included)."""
    return {f.name for f in text_string_to_metric_families(get(url + "/metrics")[1])}


def value(m: dict, name: str, **labels) -> float | None:
    return m.get((name, frozenset(labels.items())))


def start_site(log_url, run, tmp_path, name="s", *extra):
    """A `hilo consume` process with a metrics endpoint on a free port; returns (process, base URL)."""
    p = hilo("consume", "--log", log_url, "--run", run, "--site", name, "--state-dir", str(tmp_path / name),
             "--no-export",
             "--metrics-port", "0", "--metrics-host", "127.0.0.1", "--wait-checkpoint", "60", "--no-progress", *extra)
    line = wait_for_line(p, r"metrics on http://")
    return p, re.search(r"(http://[0-9.]+:\d+)/metrics", line).group(1)


def stop(p) -> int:
    p.send_signal(signal.SIGTERM)
    return p.wait(timeout=60)


def test_a_site_exports_the_truth_of_the_log(log_url, tmp_path, logs):
    run = new_run("metrics")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url))
    publish_random(producer, 4)
    p, url = start_site(log_url, run, tmp_path)
    try:
        wait_until(lambda: value(scrape(url), "hilo_site_applied_version") == 4, 60, "the site applies v4")
        publish_random(producer, 3, seed=1)
        wait_until(lambda: value(scrape(url), "hilo_site_applied_version") == 7, 60, "the site applies v7")
        truth = head(logs(log_url), updates_topic(run), run).version
        wait_until(lambda: value(scrape(url), "hilo_site_head_version") == truth, 30,
                   "the head gauge reaches the log's head")
        m = scrape(url)
        assert value(m, "hilo_site_lag_versions") == truth - 7 == 0 and value(m, "hilo_site_lag_bytes") == 0
        assert value(m, "hilo_site_versions_applied_total") == 7
        for stage in STAGES:  # one observation per version applied, per stage
            assert value(m, "hilo_site_stage_seconds_count", stage=stage) == 7, stage
        assert value(m, "hilo_site_bootstrap_info", source="checkpoint") == 1
        # its share of the cluster's egress: every update record of the run, values and headers, read once
        recs = [r for r in records(logs(log_url), updates_topic(run)) if r.headers.get(H.RUN) == run]
        assert value(m, "hilo_site_update_bytes_read_total") == sum(
            len(r.value) + sum(len(k) + len(v) for k, v in r.headers.items()) for r in recs) > 0
        # freshness needs the log's record timestamps: Kafka has them, the file log does not
        fresh = value(m, "hilo_site_freshness_seconds_count")
        assert fresh == (7 if log_url.startswith("kafka://") else 0) and value(m,
                                                                               "hilo_site_freshness_seconds_sum") >= 0
        assert value(m, "hilo_site_stopped") == 0 and value(m, "hilo_site_seconds_since_applied") >= 0
        assert get(url + "/readyz") == (200, "v7, 0 behind the head\n") and get(url + "/healthz")[0] == 200
        # every metric the dashboard queries is one a site or the trainer exports
        exported = families(url) | _trainer_families(tmp_path)
        dashboard = (ROOT / "ops/grafana/hilo.json").read_text()
        queried = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in re.findall(r"hilo_[a-z_]+", dashboard)}
        assert queried and queried <= exported, queried - exported
    finally:
        assert stop(p) == 0
        producer.close()


def test_a_snapshot_the_state_dir_holds_is_counted(tmp_path):
    """Scraped while the writer is held just after putting the snapshot of v1 in place (the old one not yet removed):
    the snapshot stage counts it. (It was counted once the save returned: a scrape in between showed k - 1 while the
    state dir held v_k.)"""
    import threading
    url, run = f"file://{tmp_path}/log", new_run("snapcount")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url))
    publish_random(producer, 2)
    site = open_site(url, run, tmp_path, export_adapters=False, snapshot_every=1, until_version=2)
    in_place, go, errors = threading.Event(), threading.Event(), []

    def hold(point):  # the store's failpoint: the first snapshot waits once it is in place
        if point == "new-in-place" and not in_place.is_set():
            in_place.set()
            go.wait(60)

    def follow():
        try:
            site.run(progress=False)
        except Exception as e:  # noqa: BLE001  (the test reads it)
            errors.append(e)
    site.store.failpoint = hold
    t = threading.Thread(target=follow)
    with endpoint(site.metrics.registry) as base:
        t.start()
        try:
            assert in_place.wait(60), "no snapshot was put in place"
            held = json.loads((tmp_path / "s" / "snapshot" / "position.json").read_text())["version"]
            assert (held, value(scrape(base), "hilo_site_stage_seconds_count", stage="snapshot")) == (1, 1)
        finally:
            go.set()
            t.join(60)
    assert not errors and not t.is_alive() and site.follower.replica.version == 2, errors
    producer.close()


@contextlib.contextmanager
def endpoint(registry, ready=None, **cfg):
    """An in-process endpoint on a free port over `registry`; yields its base URL."""
    server = MetricsServer(MetricsConfig(0, "127.0.0.1", **cfg), registry)
    if ready:
        server.ready = ready
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.close()


def _trainer_families(tmp_path) -> set:
    """The families a trainer's endpoint shows."""
    producer = HiLoProducer.open(small_model(), producer_config(run=new_run("fam"), log=f"file://{tmp_path}/fam"))
    with endpoint(producer.metrics.registry) as url:
        publish_random(producer, 1)
        names = families(url)
    producer.close()
    return names


def test_a_lagging_site_reports_its_lag(log_url, tmp_path):
    run = new_run("lagging")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url))
    publish_random(producer, 2)
    # bootstrapped at v2 (genesis checkpoint + replay to come)
    site = open_site(log_url, run, tmp_path, export_adapters=False)
    publish_random(producer, 3, seed=1)
    # Kafka writes a transaction's commit marker after the commit returns: v5 becomes readable moments later.
    wait_until(lambda: site.refresh_head(force=True) or site.view.head_version == 5, 30, "the site sees v5 at the head")
    with endpoint(site.metrics.registry, lambda: site.readiness(2), ready_max_lag=2) as url:
        m = scrape(url)
        applied = site.follower.replica.version
        assert value(m, "hilo_site_head_version") == 5 and value(m, "hilo_site_lag_versions") == 5 - applied > 2
        assert value(m, "hilo_site_lag_bytes") == producer.ledger.log_bytes - site.follower.log_bytes > 0
        status, body = get(url + "/readyz")
        assert status == 503 and "behind the head v5 (bound 2)" in body
    site.close()
    producer.close()


def test_a_refused_record_counts_and_a_stopped_site_is_alive_but_not_ready(log_url, tmp_path, logs):
    run = new_run("refused")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url))
    publish_random(producer, 2)
    skipping, url = start_site(log_url, run, tmp_path, "skipping")
    stopping, url2 = start_site(log_url, run, tmp_path, "stopping", "--on-bad-record", "stop")
    try:
        for u in (url, url2):
            wait_until(lambda u=u: value(scrape(u), "hilo_site_applied_version") == 2, 60, "both sites apply v2")
        logs(log_url).append(updates_topic(run), split(os.urandom(300), run, "update", 3))  # hilo headers, no message
        wait_until(lambda: value(scrape(url), "hilo_site_records_refused_total", reason="malformed") == 1, 60,
                   "the skipping site counts the record")
        wait_until(lambda: get(url2 + "/readyz")[0] == 503, 60, "the stopping site is not ready")
        status, body = get(url2 + "/readyz")
        assert body.startswith(f"stopped: {updates_topic(run)} offset ") and "\n" not in body.strip(), body
        assert get(url2 + "/healthz") == (200, "ok\n")
        assert value(scrape(url2), "hilo_site_stopped") == 1 and value(scrape(url), "hilo_site_stopped") == 0
        publish_random(producer, 1, seed=1)
        wait_until(lambda: value(scrape(url), "hilo_site_applied_version") == 3, 60, "the skipping site goes on")
        assert get(url + "/readyz")[0] == 200
    finally:
        assert stop(skipping) == 0
        assert stop(stopping) == 1  # it stopped on an error: SIGTERM ends it, and says so
        producer.close()


def test_a_trainer_exports_its_publishes_and_its_fencing(tmp_path):
    url_log, run = f"file://{tmp_path}/log", new_run("trainer")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=url_log))
    with endpoint(producer.metrics.registry) as url:
        publish_random(producer, 3)
        m = scrape(url)
        assert value(m, "hilo_trainer_published_version") == 3 and value(m,
                                                                         "hilo_trainer_versions_published_total") == 3
        for stage in ("encode", "sign", "transaction"):
            assert value(m, "hilo_trainer_stage_seconds_count", stage=stage) == 3, stage
        assert value(m, "hilo_trainer_message_bytes_count") == 3
        assert value(m, "hilo_trainer_message_bytes_sum") == producer.ledger.log_bytes
        assert value(m,
                     "hilo_trainer_adapter_fraction") == pytest.approx(producer.last_step[
                         "bytes"] / producer.manifest.adapter_bytes())
        assert 0 < value(m, "hilo_trainer_residual_ratio") < 1
        assert value(m, "hilo_trainer_fenced") == 0
        # the file log keeps everything: a new site can join now, and for good
        assert value(m, "hilo_trainer_joinable") == 1 \
            and value(m, "hilo_trainer_joinable_until_timestamp_seconds") == float("inf")
        newer = HiLoProducer.open(small_model(), producer_config(run=run, log=url_log))  # fences the first
        with pytest.raises(FencedError):
            publish_random(producer, 1, seed=1)
        assert value(scrape(url), "hilo_trainer_fenced") == 1
        newer.close()


def test_a_port_in_use_fails_at_start_before_anything_is_applied(tmp_path):
    run = new_run("port")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=f"file://{tmp_path}/log"))
    publish_random(producer, 1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = hilo("consume", "--log", f"file://{tmp_path}/log", "--run", run, "--site", "s", "--state-dir",
                 str(tmp_path / "s"),
                 "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
        out, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert err.strip().splitlines()[-1] == f"hilo consume: error: --metrics-port {port} on 127.0.0.1: in use"
    assert not (tmp_path / "s").exists()  # nothing bootstrapped, nothing written
    with pytest.raises(ConfigError, match="metrics_port = 70000"):
        MetricsConfig(70000)
    producer.close()


def test_metric_names_follow_the_conventions_and_the_operations_page_lists_them():
    names = [spec.name for spec in TABLE]
    assert len(names) == len(set(names))
    for spec in TABLE:
        assert re.fullmatch(r"hilo_(site|trainer)_[a-z_]+", spec.name) and not spec.name.endswith("_total"), spec.name
        assert spec.kind != "counter" or not spec.key.endswith(("_seconds", "_bytes")), spec.name
    assert markdown_table() in (ROOT / "docs" / "operations.md").read_text(), ("docs/operations.md's metrics table: "
                                                                               "run `hilo docs`")
    with pytest.raises(ConfigError, match="no metric 'nope'"):
        Metrics("site", run="r", site="s").set("nope", 1)


def test_json_logs_and_lag_watch(tmp_path):
    log_url, run = f"file://{tmp_path}/log", new_run("json")
    p = hilo("--log-format", "json", "produce", "--log", log_url, "--run", run, "--steps", "2")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert lines and all({"timestamp", "level", "logger", "message"} <= set(e) for e in lines)
    site = hilo("consume", "--log", log_url, "--run", run, "--site", "s", "--state-dir", str(tmp_path / "s"),
                "--no-export",
                "--until-version", "2")
    assert site.wait(timeout=300) == 0
    w = hilo("lag", "--log", log_url, "--run", run, "--watch", "0.2", "--json")
    first, second = json.loads(w.stdout.readline()), json.loads(w.stdout.readline())
    w.send_signal(signal.SIGINT)
    assert w.wait(timeout=30) == 0
    assert second["time"] > first["time"] and [r["site"] for r in first["sites"]] == ["s"]
    assert first["sites"][0]["applied_version"] == 2 and first["sites"][0]["lag"] == 0


@pytest.mark.parametrize("held", [False, True], ids=["plain", "export-held"])
def test_every_scrape_has_lag_equal_to_head_minus_applied_while_catching_up_and_stopped(tmp_path, held, logs):
    """Scraped back to back while a site catches up (and, export-held, while each export's hook holds it), and after
    it stops on a record: lag == head - applied in every scrape, and /readyz says the same. (The lag was set only
    when the head was read, so a catching-up site exported a stale lag, and a stopped one kept it.)"""
    import threading
    url, run = f"file://{tmp_path}/log", new_run("lagview")
    model = small_model(hidden=256, layers=4, rank=16)
    producer = HiLoProducer.open(model, producer_config(run=run, log=url, checkpoint_every=1000))  # ~10 ms a version
    n = 30 if held else 40  # held: each export takes its hook's 0.2 s and an adapter write; 30 still span many scrapes
    publish_random(producer, n)
    hold = {"export_adapters": True, "on_version": "sleep 0.2"} if held else {"export_adapters": False}
    site = open_site(url, run, tmp_path, on_bad_record="stop", **hold)  # bootstrapped at v0
    logs(url).append(updates_topic(run), split(os.urandom(300), run, "update", n + 1))  # junk: the site stops on it
    errors = []

    def follow():
        try:
            site.run(progress=False)
        except Exception as e:  # noqa: BLE001  (the stop is expected; the test reads it)
            errors.append(e)
    with endpoint(site.metrics.registry, lambda: site.readiness(1000)) as base:
        t = threading.Thread(target=follow)
        t.start()
        seen = []
        while t.is_alive() or not seen:
            m = scrape(base)
            seen.append(m)
            head, applied = value(m, "hilo_site_head_version"), value(m, "hilo_site_applied_version")
            assert value(m, "hilo_site_lag_versions") == head - applied, m
            assert value(m, "hilo_site_lag_bytes") >= 0
        t.join()
        assert errors and site.stop_reason  # stopped on the junk record
        m = scrape(base)
        assert value(m, "hilo_site_applied_version") == n == producer.version
        assert value(m, "hilo_site_lag_versions") == value(m, "hilo_site_head_version") - n
        assert value(m, "hilo_site_lag_bytes") == 0  # every update byte before the junk is applied
        status, body = get(base + "/readyz")
        assert status == 503 and body.startswith("stopped:")
    assert len({value(m, "hilo_site_applied_version") for m in seen}) > 1, "no scrape landed while the site caught up"
    producer.close()
