"""The two sync modes as two strategies behind one interface (ProducerConfig.mode picks one from SYNC_MODES).

gradient: the message is the compressed gradient; every replica, the trainer's included, runs the run's
    optimizer on it, so the trainer's policy is the sites' policy.
delta: the trainer runs the optimizer on its own master copy; the message is the compressed master - site
    difference and replicas apply it with the stateless "add" step. The sites trail the master by a lag that
    `flush()` can shrink with messages that carry no new step.
Both propose without mutating anything and commit only what the log acknowledged.
"""
import torch

from .delta import ADD, MasterCopy, relative_lag


class GradientSync:
    """Gradient mode (HiLo proper)."""

    name = "gradient"
    description = "the compressed gradient; every replica runs the optimizer on it (the default)"
    master = None
    flushes = False          # whether flush() has anything to send
    STATE_FILES = ()         # trainer-only snapshot files (state_files' keys)
    lost_on_restart = ""

    def __init__(self, optimizer: str, params: list):
        self.optimizer = optimizer

    @staticmethod
    def site_optimizer(optimizer: str) -> str:
        """The step every replica applies."""
        return optimizer

    def rule(self, builder):
        """The optimizer whose hyperparameters `step()` takes."""
        return builder.optimizer

    def propose(self, builder, grads: list, hparams: dict, meta):
        """(proposal, pending trainer state) for one step; mutates nothing."""
        return builder.propose(grads, hparams, meta), None

    def flush_proposal(self, builder):
        """A message with no new step that moves the sites toward the trainer; None: nothing to flush."""
        return None

    def commit(self, pending) -> None:
        """Adopt the trainer-only state proposed with a message the log now holds."""

    def policy(self, replica) -> list:
        """The params the training model holds."""
        return replica.state.params

    def lag(self, replica) -> float:
        """How far the sites trail the trainer (relative)."""
        return 0.0

    def state_files(self) -> dict:
        """Trainer-only state for its snapshot: {file name: object for torch.save}."""
        return {}

    def load_state_files(self, objs: dict, where: str) -> None:
        """Restore `state_files()` output."""


class DeltaSync(GradientSync):
    """Delta mode: the trainer's master copy runs the optimizer; replicas add the compressed difference."""

    name = "delta"
    description = "the compressed master - site difference; the trainer's master runs the optimizer, sites only add"
    flushes = True
    STATE_FILES = ("master.pt",)
    lost_on_restart = " and the master from the sites' params with fresh optimizer state"

    def __init__(self, optimizer: str, params: list):
        self.master = MasterCopy(params, optimizer)

    @staticmethod
    def site_optimizer(optimizer: str) -> str:
        """Sites only add."""
        return ADD

    def rule(self, builder):
        """The master's optimizer."""
        return self.master.optimizer

    def propose(self, builder, grads, hparams, meta):
        """The master steps; the message carries its compressed movement toward the sites' copy."""
        master_next, movement = self.master.propose(grads, hparams)
        return builder.propose(movement, {}, meta, target=master_next.params), master_next

    def flush_proposal(self, builder):
        """No new movement: the whole budget goes to what the encoder still holds back."""
        zeros = [torch.zeros_like(p) for p in self.master.params]
        return builder.propose(zeros, {}, {"flush": 1}, target=self.master.params)

    def commit(self, pending) -> None:
        """Adopt the proposed master state."""
        if pending is not None:
            self.master.commit(pending)

    def policy(self, replica) -> list:
        """The master's params: the trainer trains on the policy ahead of the sites."""
        return self.master.params

    def lag(self, replica) -> float:
        """||master - site|| / ||master||."""
        return relative_lag(self.master.params, replica.state.params)

    def state_files(self) -> dict:
        """The master (never published)."""
        return {"master.pt": self.master.state_dict()}

    def load_state_files(self, objs: dict, where: str) -> None:
        """Restore the master."""
        self.master.load_state_dict(objs["master.pt"], f"{where}/master.pt")


SYNC_MODES = {cls.name: cls for cls in (GradientSync, DeltaSync)}  # the one table: ProducerConfig.mode, --mode
