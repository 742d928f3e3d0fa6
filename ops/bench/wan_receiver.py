"""A site's network side for `hilo bench wan`: fetch and reassemble messages, record when each is complete.

    ip netns exec hilo-site-1 python -m hilo.ops.bench.wan_receiver --log kafka://10.77.0.1:9192 --run R --versions 3

No decode or apply here: their CPU cost is measured separately, so the shared 2-core machine does not
leak compute time into the network figures. Prints one JSON line per message: {"version", "t", "bytes"}.
"""
import argparse
import json
import time

from hilo.log import open_log, updates_topic
from hilo.schemas.chunks import Reassembler


def main(argv=None):
    """Follow RUN.updates from offset 0 until --versions messages are complete."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--versions", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args(argv)
    log = open_log(a.log)
    topic = updates_topic(a.run)
    r, offset, done = Reassembler(a.run, topic), 0, 0
    print(json.dumps({"ready": time.time()}), flush=True)
    deadline = time.monotonic() + a.timeout
    while done < a.versions and time.monotonic() < deadline:
        for rec in log.read(topic, offset, timeout_s=0.5, max_bytes=64 << 20):
            offset = rec.offset + 1
            msg = r.feed(rec)
            if msg is not None:
                done += 1
                print(json.dumps({"version": msg.version, "t": time.time(), "bytes": len(msg.data)}), flush=True)
    log.close()


if __name__ == "__main__":
    main()
