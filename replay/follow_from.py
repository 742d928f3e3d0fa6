"""Where a follower begins, from the Position it is given: the keys it trusts and the offset of its next version on
the log it reads (a Position's offset is a place on one cluster; the version is the same place on every cluster).
"""
import logging

from hilo.log.tail import locate
from hilo.schemas.errors import Expired
from hilo.schemas.keyring import Keyring
from hilo.schemas.position import Position
from hilo.schemas.signing import Verifier

from .checks import accepts

logger = logging.getLogger(__name__)


def trusted_keyring(trust: Keyring | Verifier | None, position: Position) -> Keyring:
    """The reader's keyring (`trust`; a Verifier: the run's key as configured; None: an unsigned run), trusting the
    newest key rotation `position` records (this reader verified it before a restart), else the keyring's root."""
    keyring = trust if isinstance(trust, Keyring) else Keyring(trusted=trust)
    root = keyring.root
    keyring.trust(Verifier.from_raw(bytes.fromhex(position.keys[-1][1])) if root is not None and position.keys
                  else root)
    return keyring


def next_version_offset(log, topic: str, run: str, replica, position: Position) -> int:
    """The offset of `replica`'s next version on `log`'s `topic`, searched from `position`; Expired when the log no
    longer retains it."""
    next_offset = position.next_offset
    if not log.retained(topic, next_offset):
        raise Expired(f"{topic}: v{replica.version + 1} at offset {next_offset} is no longer retained "
                      f"(log begins at {log.begin_offset(topic)}); bootstrap from a newer checkpoint (a "
                      f"restarted site does; if none covers it, the trainer's next checkpoint will)")
    next_offset = max(next_offset, log.begin_offset(topic))
    # An offset is a place on one cluster; the version is the place on every cluster of the run (a mirror holds
    # the same versions at other offsets): find where the next version is here.
    located = locate(log, topic, run, replica.version + 1, next_offset, accept=accepts(replica, topic))
    if located != next_offset:
        logger.info("%s: v%d is at offset %d here (the stored position, offset %d, is another cluster's)",
                    topic, replica.version + 1, located, next_offset)
    return located
