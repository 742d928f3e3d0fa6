"""Subprocess side of test_determinism: apply framed messages from a folder, print the digest after each.

    python _apply_worker.py DIR [MODE]   # DIR/<stream>/genesis.ckpt and DIR/<stream>/000001.msg ...
MODE: the replicas' apply mode (kernel, reference, kernel-only; default: PolicyReplica's).
Prints one JSON object: {stream: [digest hex per version]}.
"""
import json
import pathlib
import sys

from hilo.replica.replica import PolicyReplica
from hilo.schemas.records import decode_record

out = {}
for stream in sorted(p for p in pathlib.Path(sys.argv[1]).iterdir() if p.is_dir()):
    replica = PolicyReplica.from_checkpoint(decode_record((stream / "genesis.ckpt").read_bytes(), "genesis"))
    if len(sys.argv) > 2:
        replica.apply_mode = sys.argv[2]
    digests = []
    for msg in sorted(stream.glob("*.msg")):
        assert replica.apply_bytes(msg.read_bytes(), msg.name)
        digests.append(replica.digest.hex())
    out[stream.name] = digests
print(json.dumps(out))
