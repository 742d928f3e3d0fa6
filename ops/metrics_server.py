"""The HTTP endpoint a long-running command serves: /metrics (Prometheus), /healthz (alive), /readyz (ready).

    hilo consume ... --metrics-port 9400   # curl :9400/metrics, :9400/healthz, :9400/readyz

/metrics is prometheus_client's own WSGI app over the process's registry (schemas/metrics.py is the table).
/healthz answers 200 while the process runs. /readyz answers 200 or 503 with a one-line reason, from the
`ready` callable the command gives (a site: bootstrapped, not stopped by an error, lag within a bound).
The port is bound before anything else happens, so a port in use or not allowed fails the command at start.
"""
import errno
import logging
import sys
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from hilo.log import threads
from hilo.schemas.errors import ConfigError
from hilo.schemas.options import opt

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricsConfig:
    """Where the endpoint listens and what /readyz requires; checked at construction. Each field's help is in its
    metadata (`hilo consume --help`, docs/cli.md); a command without --metrics-port builds none and serves nothing."""

    metrics_port: int = opt(help="serve /metrics, /healthz and /readyz on this TCP port (0: any free port, logged at "
                            "start; not given: serve nothing)")
    metrics_host: str = opt("0.0.0.0",
                            "the address that port is bound on (0.0.0.0: every interface, as Prometheus scrapes "
                            "from another machine)")
    ready_max_lag: int = opt(10, "/readyz answers 503 while a site is more than this many versions behind the head")

    def __post_init__(self):
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"MetricsConfig.metrics_port = {self.metrics_port}: expected 0..65535")
        if self.ready_max_lag < 0:
            raise ConfigError(f"MetricsConfig.ready_max_lag = {self.ready_max_lag}: must be >= 0")


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds the process open

    def handle_error(self, request, client_address):
        """One line for a request that failed (a scraper gone mid-answer), not socketserver's traceback on stderr."""
        logger.warning("metrics endpoint: a request from %s failed: %s", client_address[0], sys.exc_info()[1])


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):  # one line per scrape would drown the site's own log
        pass


def _starting():
    return False, "starting"


class MetricsServer:
    """/metrics, /healthz and /readyz on a daemon thread; `ready` is swapped in once the process can answer it."""

    def __init__(self, cfg: MetricsConfig, registry):
        self.metrics_app = make_wsgi_app(registry)
        self.ready = _starting
        try:
            self.httpd = make_server(cfg.metrics_host, cfg.metrics_port, self.app, server_class=_Server,
                                     handler_class=_Quiet)
        except OSError as e:
            why = {errno.EADDRINUSE: "in use", errno.EACCES: "not allowed (ports below 1024 need root)",
                   errno.EADDRNOTAVAIL: "an address this machine does not have"}.get(e.errno, e.strerror)
            raise ConfigError(f"--metrics-port {cfg.metrics_port} on {cfg.metrics_host}: {why}") from None
        self.port = self.httpd.server_port
        self.url = f"http://{cfg.metrics_host}:{self.port}"
        threads.start(self.httpd.serve_forever, "hilo-metrics")
        logger.info("metrics on %s/metrics, health on /healthz and /readyz", self.url)

    def app(self, environ, start_response):
        """The WSGI app: route by path."""
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            return self._text(start_response, True, "ok")
        if path == "/readyz":
            try:
                ok, why = self.ready()
            except Exception as e:  # noqa: BLE001  (a probe must answer, not hang or 500)
                ok, why = False, f"readiness check failed: {e}"
            return self._text(start_response, ok, why)
        if path in ("/", "/metrics"):
            return self.metrics_app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: /metrics, /healthz, /readyz\n"]

    @staticmethod
    def _text(start_response, ok: bool, text: str):
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
        return [text.encode() + b"\n"]

    def close(self):
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
