"""The hilo-sync vLLM plugin's spin bound (HILO_VLLM_SPIN_S), run in the vLLM venv against vLLM's own queue class.

vLLM's shared-memory queue reader spins (sched_yield) for 1 s after each message before it sleeps on the queue's
notify socket; the plugin bounds that spin. Observed here as time: a reader that read just now and is asked to
wait 300 ms returns at once when it spins (the caller loops), and only after the poll's timeout when it sleeps.
One process tries the values in turn (importing vLLM costs seconds): a refused value must leave vLLM's spin as it
was, so a valid one after it still has something to patch.
"""
import os
import pathlib
import subprocess
import textwrap

PLUGIN_DIR = pathlib.Path(__file__).resolve().parents[2] / "ops" / "vllm" / "plugin"
PROBE = textwrap.dedent("""
    import logging, sys, time, zmq
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    import hilo_vllm_plugin
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    reader = SpinCondition(True, zmq.Context(), "inproc://hilo-probe")
    for value in sys.argv[1:]:
        hilo_vllm_plugin._bound_spin(None if value == "unset" else value)
        reader.record_read()
        started = time.monotonic()
        reader.wait(timeout_ms=300)
        print(f"{value} waited {time.monotonic() - started:.3f}", flush=True)
        print(f"{value} done", file=sys.stderr, flush=True)
""")


def _vllm_python() -> pathlib.Path:
    venv = pathlib.Path(os.environ.get("HILO_VLLM_VENV", pathlib.Path.home() / ".cache/hilo-sync/vllm-venv"))
    assert (venv / "bin/python").exists(), f"no vLLM venv at {venv}: ops/vllm/install.sh makes it (ops/test.sh runs it)"
    return venv / "bin/python"


def _probe(*values: str) -> dict:
    """{value: (seconds the reader's wait took, what the plugin logged)}, HILO_VLLM_SPIN_S=value in turn."""
    done = subprocess.run([_vllm_python(), "-c", PROBE, *values], capture_output=True, text=True, timeout=120,
                          env=os.environ | {"PYTHONPATH": str(PLUGIN_DIR)})
    assert done.returncode == 0, done.stderr[-2000:]
    waited = dict(line.split(" waited ") for line in done.stdout.splitlines())
    said, logged = {}, []
    for line in done.stderr.splitlines():
        if line.endswith(" done"):
            said[line.removesuffix(" done")] = "\n".join(logged)
            logged = []
        else:
            logged.append(line)
    return {v: (float(waited[v]), said[v]) for v in values}


def test_the_spin_bound_sleeps_at_once_at_zero_and_a_refused_value_keeps_vllms_spin():
    seen = _probe("unset", "-1", "soon", "0")
    for value in ("unset", "-1", "soon"):
        waited, said = seen[value]
        assert waited < 0.25, f"HILO_VLLM_SPIN_S={value}: the reader slept {waited} s instead of spinning"
        assert ("HILO_VLLM_SPIN_S" in said) == (value != "unset"), said
    waited, said = seen["0"]
    assert waited >= 0.25 and not said, f"HILO_VLLM_SPIN_S=0: the reader waited {waited} s ({said!r})"
