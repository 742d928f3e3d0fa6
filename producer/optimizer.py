"""HiLoOptimizer: a real torch.optim.Optimizer over a PEFT model's LoRA parameters, backed by HiLoProducer.

    opt = HiLoOptimizer(peft_model, ProducerConfig(run="exp1", log="kafka://broker:9092"), lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    Trainer(model=peft_model, args=args, train_dataset=ds, optimizers=(opt, sched)).train()

`step()` publishes one version from the current `.grad`s (after whatever clipping the loop did), applies
it to the trainer's replica and writes the new params into the model; `zero_grad()` is torch's. The
group's "lr" (and any other hyperparameter of the run's optimizer) is read at every step and travels in
the message, so any LR scheduler drives it. A skipped step (a grad scaler that found Inf) publishes nothing.
`state_dict()` names the run's version and digest and carries the encoder's error-feedback state (and in
delta mode the master's params and optimizer state: ProducerConfig(mode="delta")), so a
framework's checkpoint/resume continues the same run: never a duplicate version, never a fork.
In a torch.distributed job (torchrun, accelerate launch) construct it on every rank: one rank publishes and every
rank's model holds the published params (producer/rank_trainer.py).
"""
import logging

import torch

from hilo.replica.optimizers import get_optimizer
from hilo.schemas.errors import ConfigError, LogError

from .config import ProducerConfig
from .rank_launch import unwrap
from .lora_params import lora_parameters
from .producer import HiLoProducer

logger = logging.getLogger(__name__)
HOUSEKEEPING = frozenset({"params", "initial_lr", "name"})  # group keys torch schedulers and frameworks add


def _group_defaults(model: torch.nn.Module, config: ProducerConfig, hparams: dict) -> dict:
    """The param group's hyperparameters; refuses names the run's optimizer lacks and trainable non-LoRA params."""
    rule = get_optimizer(config.optimizer)  # gradient mode: every replica's step; delta mode: the master's
    unknown = sorted(set(hparams) - set(rule.hparams))
    if unknown:
        raise ConfigError(f"HiLoOptimizer: {unknown} are not hyperparameters of {rule.name!r} (it has "
                          f"{sorted(rule.hparams)})")
    defaults = rule.check_hparams(rule.defaults() | config.hparams | hparams, "HiLoOptimizer")
    lora = {id(p) for p in lora_parameters(model, config.adapter)[1]}
    stray = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in lora]
    if stray:
        raise ConfigError(f"HiLoOptimizer: {len(stray)} trainable parameter(s) outside LoRA adapter {config.adapter!r} "
                          f"would not be replicated to the sites, e.g. {stray[0]!r}; freeze them (modules_to_save is "
                          f"not supported)")
    return defaults


class HiLoOptimizer(torch.optim.Optimizer):
    """One param group: the adapter's LoRA parameters, in manifest order.

    model: a PEFT model with a LoRA adapter (`config.adapter`); every other parameter must be frozen.
    config: the run (ProducerConfig); its optimizer is the update rule every replica runs.
    log_backend: an opened log to use instead of `config.log`. Default: None
    **hparams: the group's hyperparameters (lr, betas as beta1/beta2, weight_decay, ...), defaulting to
        config.hparams and then the optimizer's defaults; names the run's optimizer lacks are refused.
    """

    def __init__(self, model: torch.nn.Module, config: ProducerConfig, log_backend=None, **hparams):
        model, checked = unwrap(model), {}

        def check():  # every refusal before the log is opened (in a torch.distributed job, on every rank at once)
            checked["defaults"] = _group_defaults(model, config, hparams)
            return {"HiLoOptimizer hyperparameters": repr(sorted(hparams.items()))}
        self.producer = HiLoProducer.open(model, config, log_backend, check=check)
        super().__init__(self.producer.params, checked["defaults"])

    def add_param_group(self, param_group: dict) -> None:
        """Only the constructor's single group: the adapter is replicated as a whole."""
        if self.param_groups:
            raise ConfigError("HiLoOptimizer: has exactly one param group, the LoRA adapter; it cannot take another")
        super().add_param_group(param_group)

    @property
    def version(self) -> int:
        """The last published version of the run."""
        return self.producer.version

    def hparams(self) -> dict:
        """This step's hyperparameters from the group (what schedulers set), checked against the run's optimizer."""
        group = self.param_groups[0]
        rule = self.producer.rule
        extra = sorted(set(group) - set(rule.hparams) - HOUSEKEEPING)
        if extra:
            raise ConfigError(f"HiLoOptimizer: param group key(s) {extra} cannot be honoured by {rule.name!r}; "
                              f"the run's {rule.name} takes {sorted(rule.hparams)}")
        return rule.check_hparams({k: float(group[k]) for k in rule.hparams}, "HiLoOptimizer param group")

    @torch.no_grad()
    def step(self, closure=None):
        """Publish one version from the current gradients; the model's LoRA params become the new version's."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.producer.step(zero_grad=False, **self.hparams())
        return loss

    def state_dict(self) -> dict:
        """Torch's layout plus "hilo": run, version, digest and the encoder state (tensors, ints, strs only)."""
        sd = super().state_dict()
        p = self.producer
        sd["hilo"] = {"run": p.config.run, "version": p.version, "digest": p.replica.digest.hex()}
        if p.builder is not None:  # a torch.distributed job: the publishing rank's alone (producer/rank_trainer.py)
            sd["hilo"]["encoder"] = p.builder.encoder.state_dict()
        if p.master is not None:
            sd["hilo"]["master"] = p.master.state_dict()
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Resume: the log is the truth. The run must match and the saved version must be on this run's history;
        the encoder state is adopted only when the log head is the saved version (else it belongs to an older step)."""
        saved = state_dict.get("hilo")
        if saved is None:
            raise ConfigError("HiLoOptimizer.load_state_dict: not a HiLoOptimizer state (no 'hilo' entry)")
        p = self.producer
        if saved["run"] != p.config.run:
            raise LogError(f"HiLoOptimizer.load_state_dict: the checkpoint belongs to run {saved['run']!r}, "
                           f"this optimizer publishes {p.config.run!r}")
        v, head = int(saved["version"]), p.version
        known = p.replica.recent.get(v)
        if v > head:
            raise LogError(f"run {p.config.run}: the checkpoint is at v{v} but the log ends at v{head}; "
                           f"this log is not the one the checkpoint was trained against")
        if known is not None and known.hex() != saved["digest"]:
            raise LogError(f"run {p.config.run}: the checkpoint's v{v} has digest {saved['digest'][:12]}, the log's "
                           f"v{v} has {known.hex()[:12]}: a fork; refusing to resume")
        super().load_state_dict({k: val for k, val in state_dict.items() if k != "hilo"})
        if v < head:
            logger.warning("run %s: the checkpoint is at v%d, the log at v%d; continuing from v%d (the log wins; the "
                           "steps after v%d will see their data again, and error feedback restarts from zero)",
                           p.config.run, v, head, head, v)
        elif p.builder is None:
            pass  # a rank of a torch.distributed job that does not publish keeps no encoder state
        elif saved.get("encoder") is None:
            logger.warning("run %s: the checkpoint has no encoder state (saved by a rank that does not publish); error "
                           "feedback restarts from zero", p.config.run)
        else:
            p.builder.encoder.load_state_dict(saved["encoder"], "HiLoOptimizer checkpoint encoder state")
            if p.master is not None and "master" in saved:
                p.master.load_state_dict(saved["master"], "HiLoOptimizer checkpoint master state")
        p.write_back()  # whatever the framework loaded into the model, the params are the log's
