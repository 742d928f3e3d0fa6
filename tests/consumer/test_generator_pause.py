"""A generating site whose vLLM stops answering says so once, whether or not it had opened the prompt queue yet."""
import logging
import socket

from hilo.consumer.config import SiteConfig
from hilo.consumer.generator import GenerateConfig, Generator
from hilo.consumer.serving import Serving
from hilo.log import open_log
from hilo.schemas.metrics import Metrics
from tests.conftest import new_run


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released): a connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_gone_before_the_queue_was_opened_is_said_once_and_checked_again_later(tmp_path, caplog):
    # The site's loads fail (its Serving is not healthy) before it ever took a prompt: the old generator returned
    # silently because it had no queue to leave, so an operator never learnt the site had stopped generating.
    run, clock = new_run("pause"), [100.0]
    cfg = SiteConfig(log=f"file://{tmp_path}/log", run=run, site="a", state_dir=str(tmp_path / "a"),
                     vllm=f"http://127.0.0.1:{_closed_port()}")
    serving = Serving(cfg.serving, Metrics("site", run=run, site="a"))
    serving.state.on_exported(3, tmp_path / "a" / "adapters" / "v3")
    serving.state.on_loaded()                          # it served v3 ...
    serving.state.on_failed(0.0)                       # ... and vLLM did not take the next version
    assert serving.version == 3 and not serving.healthy
    gen = Generator(GenerateConfig(reward="hilo.ops.digit_task:reward"), open_log(cfg.log), serving, run, "a",
                    clock=lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="hilo.consumer.generator"):
        for _ in range(3):
            assert gen.step() == 0
            clock[0] += 1000.0  # past any backoff: the pause is not said again while it lasts
    said = [r for r in caplog.records if r.name == "hilo.consumer.generator" and r.levelno == logging.WARNING]
    assert len(said) == 1, [r.getMessage() for r in said]  # said once, not per step
    assert gen.paused and gen.queue is None  # the queue is not opened while the server is down
