"""A hostile record as the newest on RUN.updates must not block a site's restart: junk claiming an old version, a
replayed genuine old version, a forked old version, junk claiming a version not reached yet. The restarted site starts
and follows (the fork stops it, naming
its offset). The tail used to be believed unverified: the site refused to start ("refusing to move backwards ...
remove STATE_DIR"), so anyone who can write the topic blocked every restart."""
import dataclasses
import os

import pytest

from hilo.log import updates_topic
from hilo.log.tail import last_message, records
from hilo.producer.producer import HiLoProducer
from hilo.schemas import headers as H
from hilo.schemas.chunks import split
from hilo.schemas.errors import Fork
from hilo.schemas.records import decode_record
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import open_site


def _tail(kind, log, run):
    """Append the hostile newest record(s) of `kind` to RUN.updates."""
    topic = updates_topic(run)
    v1 = [r for r in records(log, topic) if r.headers.get(H.VERSION) == "1"]
    if kind == "junk":  # hilo headers claiming v1, random bytes
        log.append(topic, split(os.urandom(300), run, "update", 1))
    elif kind == "junk-ahead":  # hilo headers claiming a version the run has not reached
        log.append(topic, split(os.urandom(300), run, "update", 9))
    elif kind == "replay":  # the genuine v1, appended again as it was
        log.append(topic, [(r.key, r.value, r.headers) for r in v1])
    else:  # "fork": a well-formed v1 that claims another digest
        msg = last_message(log, topic, run, before=v1[-1].offset + 1)
        genuine = decode_record(msg.data, "v1")
        forged = dataclasses.replace(genuine, digest=bytes(len(genuine.digest)))
        log.append(topic, split(forged.to_bytes(), run, "update", 1, extra={H.DIGEST: forged.digest.hex()}))


@pytest.mark.parametrize("kind", ["junk", "junk-ahead", "replay", "fork"])
def test_a_hostile_tail_does_not_block_a_site_restart(log_url, tmp_path, kind, logs):
    run = new_run(f"tail-{kind}")
    producer = HiLoProducer.open(small_model(), producer_config(run=run, log=log_url))
    publish_random(producer, 3)
    open_site(log_url, run, tmp_path, export_adapters=False, until_version=3).run(progress=False)  # its snapshot: v3
    log = logs(log_url)
    _tail(kind, log, run)
    # used to refuse: "moving backwards"
    site = open_site(log_url, run, tmp_path, export_adapters=False, until_version=5)
    publish_random(producer, 2, seed=1)
    if kind == "fork":
        with pytest.raises(Fork, match=r"offset \d+ \(v1\): fork at version 1"):
            site.run(progress=False)
    else:
        assert site.run(progress=False) == 5 and site.follower.replica.digest == producer.replica.digest
    producer.close()
