"""ops/wan: namespaces, shaping and teardown work, and a shaped link is measurably slower."""
import pathlib
import socket
import subprocess
import sys
import threading

import pytest

WAN = pathlib.Path(__file__).resolve().parents[2] / "ops" / "wan"
pytestmark = pytest.mark.wan

CLIENT = """
import socket, sys, time
t = time.perf_counter(); s = socket.create_connection(("10.77.0.1", int(sys.argv[1]))); n = 0
while (b := s.recv(1 << 20)):
    n += len(b)
print(n, time.perf_counter() - t)
"""


def _transfer(site: int, nbytes: int) -> float:
    """Send nbytes from the broker side to a site namespace over TCP; returns the site's measured seconds."""
    srv = socket.create_server(("10.77.0.1", 0))
    port = srv.getsockname()[1]

    def serve():
        conn, _ = srv.accept()
        conn.sendall(b"\0" * nbytes)
        conn.close()
    t = threading.Thread(target=serve)
    t.start()
    out = subprocess.run(["ip", "netns", "exec", f"hilo-site-{site}", sys.executable, "-c", CLIENT, str(port)],
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    t.join()
    srv.close()
    assert int(out[0]) == nbytes
    return float(out[1])


def _namespaces():
    return [ln.split()[0]
            for ln in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
            if ln.startswith("hilo-")]


def test_shaped_link_is_slower_and_teardown_cleans_up():
    subprocess.run([str(WAN / "setup.sh"), "--sites", "2", "--rate", "20mbit"], check=True)
    try:
        assert sorted(_namespaces()) == ["hilo-site-1", "hilo-site-2", "hilo-sw"]
        nbytes = 2_000_000
        shaped = _transfer(2, nbytes)
        subprocess.run([str(WAN / "shape.sh"), "--sites", "2", "--rate", "0", "--quiet"], check=True)
        unshaped = _transfer(2, nbytes)
        subprocess.run([str(WAN / "shape.sh"), "--sites", "2", "--rate", "20mbit", "--shared", "--quiet"], check=True)
        shared = _transfer(1, nbytes)
        wire = nbytes * 8 / 20e6  # 0.8 s at 20 Mbit/s
        assert shaped > 0.8 * wire and shared > 0.8 * wire
        assert shaped > 5 * unshaped, (shaped, unshaped)
    finally:
        subprocess.run([str(WAN / "teardown.sh")], check=True)
    assert _namespaces() == []
    # A second setup after an unclean exit starts from scratch.
    subprocess.run([str(WAN / "setup.sh"), "--sites", "1", "--rate", "0"], check=True, capture_output=True)
    subprocess.run([str(WAN / "setup.sh"), "--sites", "1", "--rate", "0"], check=True, capture_output=True)
    subprocess.run([str(WAN / "teardown.sh")], check=True)
    assert _namespaces() == []
