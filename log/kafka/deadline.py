"""Bounding a kafka-python call that waits without a bound, with defined cancel semantics.

kafka-python's commit_transaction and abort_transaction wait on their result with no timeout while the
transaction coordinator is unreachable. `call_within` runs such a call on a daemon thread and stops waiting at
the deadline. The call cannot be interrupted, so it is *abandoned*: its eventual result or error is discarded,
`on_abandon` runs first (the writer closes the producer, so the abandoned thread ends with it or stays parked on
a closed client until the process exits), and the caller raises KafkaTimeoutError; the trainer then asks the log
what happened. `abandoned` counts such threads in this process.
"""
from kafka.errors import KafkaTimeoutError

from hilo.log import threads

abandoned = 0


def call_within(fn, seconds: float, on_abandon):
    """fn(), or KafkaTimeoutError after `seconds` (having run `on_abandon()` and discarded fn's outcome)."""
    global abandoned
    box = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001  (handed to the caller's thread)
            box["error"] = e
    t = threads.start(run, "hilo-txn")
    t.join(seconds)
    if t.is_alive():
        abandoned += 1
        on_abandon()
        raise KafkaTimeoutError(f"no answer from the transaction coordinator within {seconds:.0f}s")
    if "error" in box:
        raise box["error"]
    return box.get("result")
