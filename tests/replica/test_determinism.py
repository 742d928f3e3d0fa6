"""Every codec x optimizer, and every codec in delta mode: two separate processes applying the same 10 messages
reach the trainer's digests."""
import json
import os
import pathlib
import subprocess
import sys

from hilo.replica.codecs import Budget, make_encoder
from hilo.producer.delta import ADD, MasterCopy
from hilo.producer.update_builder import UpdateBuilder
from tests.conftest import CODECS, LR, OPTIMIZERS, genesis

STEPS = 10


def test_two_processes_match_trainer_digest_at_every_version(tmp_path, manifest, grads):
    expected = {}
    for codec in CODECS:
        for opt in OPTIMIZERS:
            name = f"{codec}-{opt}"
            d = tmp_path / name
            d.mkdir()
            replica = genesis(manifest, opt)
            (d / "genesis.ckpt").write_bytes(replica.checkpoint().to_bytes())
            builder = UpdateBuilder(replica, make_encoder(codec, manifest, Budget(0.25)))
            expected[name] = []
            for v in range(1, STEPS + 1):
                msg = builder.step(grads.next(), {"lr": LR[opt]})
                (d / f"{v:06d}.msg").write_bytes(msg.to_bytes())
                expected[name].append(replica.digest.hex())
            assert len(set(expected[name])) == STEPS, f"{name}: state did not change every version"
        # delta mode: a Muon master ahead of "add" sites (the sites need no bit-identical matmul)
        name = f"{codec}-delta"
        d = tmp_path / name
        d.mkdir()
        replica = genesis(manifest, ADD)
        (d / "genesis.ckpt").write_bytes(replica.checkpoint().to_bytes())
        master, builder = MasterCopy(replica.state.params,
                                     "muon"), UpdateBuilder(replica, make_encoder(codec, manifest, Budget(0.25)))
        expected[name] = []
        for v in range(1, STEPS + 1):
            state, movement = master.propose(grads.next(), {"lr": LR["muon"]})
            master.commit(state)
            (d / f"{v:06d}.msg").write_bytes(builder.step(movement).to_bytes())
            expected[name].append(replica.digest.hex())
        assert len(set(expected[name])) == STEPS, f"{name}: state did not change every version"
    worker = pathlib.Path(__file__).with_name("_apply_worker.py")
    # One thread each: two workers share this machine's cores, and the trainer (this process) runs with
    # torch's default thread count, so the comparison also crosses thread counts.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(worker), str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    results = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    for r in results:
        assert r == expected
