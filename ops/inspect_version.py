"""`hilo inspect --version V`: the header fields of one update and, per block, the codec's rank/k and bytes."""
from hilo.log import updates_topic
from hilo.log.tail import last_message
from hilo.schemas.chunks import Reassembler
from hilo.schemas.errors import LogError
from hilo.schemas.records import UpdateMessage, decode_record


def find_update(log, run: str, version: int):
    """(Message, UpdateMessage) of `version`, scanning RUN.updates from the oldest retained record."""
    topic = updates_topic(run)
    end = log.end_offset(topic)
    pos = log.begin_offset(topic)
    r = Reassembler(run, topic)
    while pos < end:
        recs = log.read(topic, pos, timeout_s=5.0)
        if not recs:
            break
        for rec in recs:
            if rec.parsed.version == version:
                msg = r.feed(rec)
                if msg is not None:
                    upd = decode_record(msg.data, f"{topic} offset {msg.first_offset}")
                    if isinstance(upd, UpdateMessage):
                        return msg, upd
        pos = recs[-1].offset + 1
    head = last_message(log, topic, run)
    raise LogError(f"{topic}: no complete update for v{version} (retained versions end at "
                   f"v{head.version if head else 0})")


def describe(log, run: str, version: int, manifest=None) -> dict:
    """Header fields and per-block payload summary of one update."""
    msg, upd = find_update(log, run, version)
    blocks = []
    for e in upd.blocks:
        size = sum(len(v) for v in e.values() if isinstance(v, bytes))
        rank = e.get("k", e.get("n", "all"))
        blocks.append({"i": e["i"], "block": manifest.blocks[e["i"]].key if manifest else None, "k": rank,
                       "bytes": size})
    return {
        "run": upd.run, "version": upd.version, "offsets": [msg.first_offset, msg.last_offset], "bytes": len(msg.data),
        "chunks": msg.last_offset - msg.first_offset + 1, "parent_digest": upd.parent_digest.hex(),
        "digest": upd.digest.hex(),
        "manifest_id": upd.manifest_id.hex(), "codec": upd.codec, "codec_params": upd.codec_params,
        "optimizer": upd.optimizer, "hparams": upd.hparams, "meta": upd.meta, "blocks_sent": len(blocks),
        "blocks": blocks,
    }
