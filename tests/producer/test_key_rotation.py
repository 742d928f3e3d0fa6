"""One rotation, seen by everyone holding the keyring: the trainer, its checkpoints, its rollout exchange, and (once it
reads the signed 'next key' record) a running site's follower, replica and generator (issue 55, item 4)."""
import itertools

from hilo.log import checkpoints_topic, prompts_topic
from hilo.log.tail import last_message, records
from hilo.ops.digit_task import prompts
from hilo.producer.producer import HiLoProducer
from hilo.producer.rollout_exchange import RolloutExchange
from hilo.schemas.framing import split_trailer
from hilo.producer.rollout_book import RolloutPolicy
from hilo.schemas.rollouts import Sampling
from hilo.schemas.signing import Signer, generate
from tests.conftest import new_run, producer_config, publish_random, small_model
from tests.helpers import open_site


def test_one_rotation_mid_run_moves_every_signer_and_verifier(tmp_path):
    old, new = (generate(tmp_path / n) for n in ("old", "new"))
    old_id, new_id = (Signer.load(k[0]).key_id for k in (old, new))
    url, run = f"file://{tmp_path}/log", new_run()
    producer = HiLoProducer.open(small_model(),
                                 producer_config(run=run, log=url, signing_key=str(old[0]), checkpoint_every=100))
    site = None
    try:
        exchange = RolloutExchange.open(producer.log, run, RolloutPolicy(batch_prompts=1, max_staleness=4),
                                        keyring=producer.keyring, prompt_partitions=1)
        publish_random(producer, 2)
        site = open_site(url, run, tmp_path, "live", trust=str(old[1]), export_adapters=False)
        site.follower.catch_up_all()
        follower = site.follower
        assert follower.replica.version == 2 and follower.keyring is site.keyring is follower.replica.keyring
        assert producer.checkpoints.keyring is producer.keyring is exchange.keyring  # held, not copied
        signers = lambda: {k.signer.key_id  # noqa: E731
                           for k in (producer.keyring, producer.checkpoints.keyring, exchange.keyring)}
        assert signers() == {old_id} and follower.replica.verifier.key_id == old_id

        producer.rotate_key(str(new[0]))  # the one call

        assert signers() == {new_id} and producer.keyring.verifier.key_id == producer.replica.verifier.key_id == new_id
        assert producer.keyring.history == (old_id.hex(), new_id.hex())
        # the rotation's checkpoint: signed by the new key
        ckpt = last_message(producer.log, checkpoints_topic(run), run)
        assert split_trailer(ckpt.data, "checkpoint")[1][:8] == new_id
        assert exchange.issue(itertools.islice(prompts(run, Sampling(n=1, temperature=1.0, top_p=1.0, max_tokens=4,
                                                                     seed=0)), 1)) == 1
        prompt = next(records(producer.log, prompts_topic(run), 0, start=0))
        assert split_trailer(prompt.value, "prompt")[1][:8] == new_id  # the exchange signs with the rotated key

        assert follower.replica.verifier.key_id == old_id  # a site moves when it reads the signed 'next key' record
        publish_random(producer, 1, seed=1)
        assert follower.catch_up_all() == 1 and follower.replica.digest == producer.replica.digest
        assert follower.replica.verifier.key_id == site.keyring.verifier.key_id == new_id
        assert site.keyring.history == (old_id.hex(), new_id.hex()) and site.keyring.root.key_id == old_id
        site.keyring.verify_any(*split_trailer(prompt.value, "prompt"), "prompt")  # what the site's generator checks
    finally:
        if site is not None:
            site.close()
        producer.close()
