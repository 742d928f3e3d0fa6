"""A Kafka broker of its own whose clients reach it through a latency proxy: Kafka behind an emulated round trip.

ops/wan/ adds delay with tc netem inside network namespaces, which needs root and a kernel with sch_netem; this needs
neither. ops/kafka/start.sh starts one node on PORT (its own traffic: transaction markers to itself stay local, as on
a real WAN), controller PORT+1, and a listener for clients on PORT+2 that it advertises as PORT+3, where
ops/wan/toxiproxy.sh forwards to PORT+2 with half the RTT added each way. A client bootstrapping from the proxy
(`url`) is told the proxy's address, so every connection it makes pays the RTT. Both are stopped, and the broker's
data wiped, on leaving the `with` block.
"""
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

OPS = pathlib.Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
DEFAULT_PORT = 19892  # the broker's; it takes the next three too


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class DelayedBroker:
    """One broker on PORT..PORT+2 and a toxiproxy on PORT+3 in front of it, `rtt_ms` of round trip; a context
    manager."""

    def __init__(self, rtt_ms: int, port: int = DEFAULT_PORT):
        cache = os.environ.get("HILO_CACHE", os.path.expanduser("~/.cache/hilo-sync"))
        self.rtt_ms, self.port = rtt_ms, port
        self.env = dict(os.environ, HILO_KAFKA_PORT=str(port), HILO_KAFKA_HOST=HOST,
                        HILO_KAFKA_ADVERTISED_PORT=str(port + 3),
                        HILO_KAFKA_DIR=os.path.join(cache, f"kafka-delayed-{port}"),
                        HILO_TOXIPROXY_DIR=os.path.join(cache, f"toxiproxy-{port}"))
        self.url = f"kafka://{HOST}:{port + 3}"

    def _run(self, script: str, *args: str, check: bool = True) -> None:
        subprocess.run([str(OPS / script), *args], env=self.env, check=check, stdout=sys.stderr)

    def __enter__(self) -> "DelayedBroker":
        try:
            self._run("wan/toxiproxy.sh", "start", "--listen", f"{HOST}:{self.port + 3}",
                      "--upstream", f"{HOST}:{self.port + 2}", "--rtt-ms", str(self.rtt_ms),
                      "--api-port", str(_free_port()))
            self._run("kafka/stop.sh", "--wipe")  # a broker left by a run that was killed, and its topics
            self._run("kafka/start.sh")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._run("wan/toxiproxy.sh", "stop", check=False)
        self._run("kafka/stop.sh", "--wipe", check=False)

    def set_rtt(self, rtt_ms: int) -> None:
        """The proxy's round trip, changed (the broker stays up)."""
        self._run("wan/toxiproxy.sh", "rtt", "--rtt-ms", str(rtt_ms))
        self.rtt_ms = rtt_ms

    def metadata_s(self, proxied: bool = True, times: int = 5) -> float:
        """Median seconds of a metadata request on an open connection, through the proxy or straight to the broker:
        what one round trip with the broker costs a client."""
        from kafka import KafkaAdminClient
        port = self.port + 3 if proxied else self.port
        admin = KafkaAdminClient(bootstrap_servers=f"{HOST}:{port}", request_timeout_ms=30000)
        try:
            admin.describe_cluster()  # connects (and learns the node's advertised address)
            took = []
            for _ in range(times):
                t0 = time.perf_counter()
                admin.describe_cluster()
                took.append(time.perf_counter() - t0)
            return statistics.median(took)
        finally:
            admin.close()
