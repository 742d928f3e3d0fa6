"""`hilo bench trainer --rtt-ms`: its broker's clients pay the round trip (a metadata request through toxiproxy takes
the RTT, one straight to the broker does not), its row is in the JSON, and it leaves no broker or proxy running."""
import json
import pathlib
import socket
import subprocess

import pytest

from hilo.ops.bench.delayed_broker import DelayedBroker
from hilo.ops.cli import main

# One worker: its broker takes ports 19896-19898, the proxy 19899 (the bench's default is 19892-19895)
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.xdist_group("trainer-wan")]
PORT = 19896
TOXIPROXY = pathlib.Path(__file__).resolve().parents[2] / "ops" / "wan" / "toxiproxy.sh"
RTT_MS = 100


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_wan_row_runs_behind_the_delayed_broker_and_stops_it(tmp_path):
    # ops/test.sh installs it (cached, as the Kafka jars are); a missing one fails here, it is not skipped
    assert subprocess.run([str(TOXIPROXY), "check"]).returncode == 0, "toxiproxy: run ops/wan/toxiproxy.sh install"
    broker = DelayedBroker(RTT_MS, PORT)  # the bench's, on the same ports: its state dirs, and a stop if it fails
    try:
        assert main(["bench", "trainer", "--shape", "tiny", "--steps", "1", "--rtt-ms", str(RTT_MS),
                     "--rows", "wan-1-pipelined", "--wan-port", str(PORT), "--out", str(tmp_path)]) == 0
        res = json.loads((tmp_path / "trainer.json").read_text())
        assert [(r["trainer"], r["rtt_ms"], r["pipeline"]) for r in res["rows"]] == [
            (f"hilo, Kafka {RTT_MS} ms RTT, pipelined", RTT_MS, True)]
        rtt = res["rtt"][str(RTT_MS)]
        # the proxy adds the round trip to every request: a floor that load cannot lower (no upper bound: a loaded
        # machine may stretch any request, proxied or straight)
        assert rtt["metadata_request_s"] >= RTT_MS / 1000 > rtt["direct_metadata_request_s"], rtt
        assert "hilo, Kafka loopback, 1 rank(s)" in res["not_run"]
        assert not any(_listening(p) for p in range(PORT, PORT + 4))
        assert not any(any(pathlib.Path(broker.env[d]).rglob("pid")) for d in ("HILO_KAFKA_DIR", "HILO_TOXIPROXY_DIR"))
    finally:
        broker.__exit__()
