"""The return path's work queue, seen from a generating site: take prompts, then settle them with their rollouts.

    queue = log.prompt_queue(run, site)
    lease = queue.take(max_prompts=4, timeout_s=1.0)      # prompts no other site holds
    queue.settle(lease, rollout_records)                    # the rollouts appear and the prompts count as answered,
                                                              together

Exactly once is the contract: settling is atomic (the rollouts become visible and the prompts leave the queue in
one step), so a site killed at any instant either settled a lease or did not, and an unsettled lease's prompts go
to another site. A site that lost its lease (it stalled past the lease, or the group moved the prompts away) gets
LeaseLost from settle and its rollouts are discarded: another site answers those prompts.
- Kafka: the sites are one consumer group (`generate_group`) on RUN.prompts, which spreads partitions and
  rebalances when a site joins or dies; settle is one transaction (transactional id per run and site, so a
  restarted site fences its own zombie) holding the rollouts and the group's offsets, fenced by the group
  generation (KIP-447) so a site whose partitions moved cannot commit.
- The embedded log: a lease per prompt under the prompts topic's lock; settle appends the rollouts in one write
  tagged with the lease, and that append is the commit (log/file_leases.py).
"""
from dataclasses import dataclass, field

DEFAULT_LEASE_S = 120.0  # embedded log: how long a taken prompt stays a site's before another site may take it


def generate_group(run: str) -> str:
    """The consumer group of the sites that generate for `run` (Kafka)."""
    return f"hilo.{run}.generate"


@dataclass
class Lease:
    """Prompts handed to one site: `records` (offset, key, value, headers), and the backend's handle to settle them."""

    records: list
    handle: object = None
    partitions: dict = field(default_factory=dict)  # Kafka: partition -> next offset once settled
    sources: list = field(default_factory=list)     # Kafka: the partition of each record

    def __len__(self):
        return len(self.records)


class PromptQueue:
    """take / settle over RUN.prompts and RUN.rollouts for one site."""

    def take(self, max_prompts: int, timeout_s: float = 1.0) -> Lease:
        """Up to `max_prompts` prompts no other site holds (possibly none within `timeout_s`)."""
        raise NotImplementedError

    def settle(self, lease: Lease, records: list) -> list:
        """Append `records` (key, value, headers) to RUN.rollouts and mark the lease's prompts answered, atomically;
        the rollouts' offsets. LeaseLost when the prompts are no longer this site's (nothing is appended)."""
        raise NotImplementedError

    def release(self, lease: Lease) -> None:
        """Give the lease's prompts back unanswered (another site, or this one, takes them again)."""

    def defer(self, lease: Lease, later: list) -> Lease:
        """Give back the records `later` of `lease` (they ask for a policy this site does not serve yet) and return the
        lease of the rest, to answer now. Kafka: a partition with a deferred record is rewound to it and paused, and
        the lease keeps only what precedes it there (offsets commit in order); the other partitions go on."""
        raise NotImplementedError

    def resume(self) -> None:
        """Take from the partitions `defer` paused again (the site serves a newer policy now)."""

    def close(self) -> None:
        """Leave the group / release files."""
