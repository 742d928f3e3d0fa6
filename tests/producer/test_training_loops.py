"""HiLoOptimizer inside the loops people run: plain PyTorch, transformers Trainer, TRL GRPOTrainer, Accelerate.

Each test trains the tiny model on the real library, with a separate `hilo consume` process following the
run; it must end at the trainer's digest, and the trainer model's LoRA weights must equal its replica's.
The snippets of README.md and docs/operations.md are copied from the blocks marked `# README`.
"""
import logging
import re
import subprocess
import sys

import pytest
import torch

from hilo.log import open_log
from hilo.ops.tiny_trainer import batch, build_base, build_tokenizer
from hilo.producer.optimizer import HiLoOptimizer
from hilo.producer.config import ProducerConfig
from hilo.replay.follower import Follower, bootstrap_from_log
from hilo.replica.codecs import Budget
from hilo.schemas.errors import ConfigError, LogError, TrainerError
from tests.conftest import small_model

pytestmark = pytest.mark.slow


class Follow:
    """A `hilo consume` process following `run` until `until`; `.digest()` waits for it and returns its final digest."""

    def __init__(self, url, run, tmp_path, until):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hilo.ops.cli", "consume", "--log", url, "--run", run, "--site", "follower",
             "--state-dir", str(tmp_path / "follower"), "--until-version", str(until), "--no-progress", "--no-export",
             "--wait-checkpoint", "300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def digest(self):
        out, err = self.proc.communicate(timeout=600)
        assert self.proc.returncode == 0, err[-3000:]
        return re.search(r"digest ([0-9a-f]{32})", out).group(1)


def published(url, run):
    """Every update message of the run, in log order (read back as a site reads it)."""
    log = open_log(url)
    replica, pos = bootstrap_from_log(log, run, max_version=0)
    return [a.update for a in Follower(log, run, replica, pos).catch_up()]


def assert_model_is_replica(opt):
    """The training model's LoRA weights are exactly the replica's params (fp32 model: bit-equal)."""
    for p, r in zip(opt.producer.params, opt.producer.replica.state.params):
        assert torch.equal(p.detach().float(), r)


def test_plain_pytorch_loop_with_clipping_and_a_scheduler(tmp_path):
    url, run, steps = f"file://{tmp_path}/log", "plain", 6
    follower = Follow(url, run, tmp_path, steps)
    model = small_model()
    gen = torch.Generator().manual_seed(0)
    norms = []
    # README: plain loop
    opt = HiLoOptimizer(model, ProducerConfig(run=run, log=url, codec="dense"), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
    for _ in range(steps):
        ids, labels = batch(gen, 8)
        model(input_ids=ids, labels=labels).loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)))
        opt.step()
        sched.step()
        opt.zero_grad()
    # README: end
    msgs = published(url, run)
    assert [m.version for m in msgs] == list(range(1, steps + 1))
    assert [m.hparams["lr"] for m in msgs] == [3e-3 / (1 + s) for s in range(steps)]  # the scheduler's rate travelled
    assert min(norms) > 0.05  # every step was clipped, so the test can see whether clipping reached the message
    from hilo.replica.codecs import decode
    for m in msgs:  # dense: the message is the clipped gradient itself
        g = decode("dense", opt.producer.manifest, m.codec_params, m.blocks, "test")
        assert abs(sum(float(x.double().pow(2).sum()) for x in g) ** 0.5 - 0.05) < 1e-4
    assert follower.digest() == opt.producer.replica.digest.hex()
    assert_model_is_replica(opt)


def test_delta_mode_under_a_scheduler_and_a_framework_checkpoint(tmp_path):
    """HiLoOptimizer in delta mode: the scheduler drives the master's AdamW, the model holds the master, a separate
    `hilo consume` process ends at the trainer's digest after the flush; state_dict resumes the master exactly."""
    url, run, steps = f"file://{tmp_path}/log", "delta", 5
    model = small_model()
    gen = torch.Generator().manual_seed(0)
    # README: delta mode
    cfg = ProducerConfig(run=run, log=url, mode="delta", codec="spar4", budget=Budget(0.25))
    opt = HiLoOptimizer(model, cfg, lr=3e-3)  # AdamW runs on the trainer's master; the sites only add
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
    for _ in range(steps):
        ids, labels = batch(gen, 8)
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    # README: end
    p = opt.producer
    # the model trains the master
    assert all(torch.equal(a.detach().float(), m) for a, m in zip(p.params, p.master.params))
    saved = opt.state_dict()
    assert set(saved["hilo"]["master"]["slots"]) == {"exp_avg", "exp_avg_sq"}
    msgs = published(url, run)
    assert [m.optimizer for m in msgs] == ["add"] * steps and all(m.hparams == {} for m in msgs)
    assert all(0 < m.meta["lag"] < 1 for m in msgs)
    sent = p.flush(lag=1e-3)
    follower = Follow(url, run, tmp_path, p.version)
    assert sent >= 1 and follower.digest() == p.replica.digest.hex()
    p.close(flush=False)

    again = HiLoOptimizer(small_model(), cfg, lr=3e-3)  # a framework resuming from its checkpoint
    again.load_state_dict(saved)  # saved before the flush: the log is ahead, so the master restarts from the sites
    assert again.version == p.version and again.producer.lag() == 0.0
    again.producer.close(flush=False)


def test_a_bf16_model_trains_on_fp32_replica_params(tmp_path):
    """Mixed precision: the model computes in bf16, the replica stays fp32; the model holds the replica's params
    rounded to bf16 (what a site exports by default, so rollouts and training see the same weights)."""
    url, run = f"file://{tmp_path}/log", "bf16"
    model = small_model().to(torch.bfloat16)
    opt = HiLoOptimizer(model, ProducerConfig(run=run, log=url, budget=Budget(0.25)), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids, labels = batch(gen, 8)
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    assert opt.version == 3 and all(r.dtype == torch.float32 for r in opt.producer.replica.state.params)
    for p, r in zip(opt.producer.params, opt.producer.replica.state.params):
        assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), r.to(torch.bfloat16))
    # fp32 kept more
    assert any(not torch.equal(r, r.to(torch.bfloat16).float()) for r in opt.producer.replica.state.params)


class AdditionData(torch.utils.data.Dataset):
    """The tiny trainer's task as a map-style dataset of {input_ids, labels}."""

    def __init__(self, n, seed=0):
        self.ids, self.labels = batch(torch.Generator().manual_seed(seed), n)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _trainer(model, opt, sched, tmp_path, max_steps, **kw):
    """The Trainer of the README snippet (4 x 3 micro-batches per optimizer step, clipping at 0.5)."""
    from transformers import Trainer, TrainingArguments
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                             gradient_accumulation_steps=3,
                             max_steps=max_steps, max_grad_norm=0.5, use_cpu=True, report_to=[], disable_tqdm=True,
                             save_strategy=kw.pop("save_strategy", "no"), **kw)
    return Trainer(model=model, args=args, train_dataset=AdditionData(128), optimizers=(opt, sched))


def test_transformers_trainer_one_version_per_optimizer_step_and_resume(tmp_path):
    from transformers import Trainer, TrainingArguments, get_linear_schedule_with_warmup
    url, run = f"file://{tmp_path}/log", "trainer"
    follower = Follow(url, run, tmp_path, 6)
    model = small_model()
    # README: transformers Trainer
    opt = HiLoOptimizer(model, ProducerConfig(run=run, log=url, budget=Budget(0.25)), lr=1e-3)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=1, num_training_steps=6)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                             gradient_accumulation_steps=3, max_steps=4, max_grad_norm=0.5, use_cpu=True,
                             report_to=[], disable_tqdm=True, save_steps=2)
    trainer = Trainer(model=model, args=args, train_dataset=AdditionData(128), optimizers=(opt, sched))
    trainer.train()
    # README: end
    assert trainer.state.global_step == 4 and opt.version == 4  # 12 micro-batches, 4 versions
    assert_model_is_replica(opt)
    # A new process resumes the run from the Trainer's checkpoint: no duplicate, no fork, steps 5 and 6.
    model2 = small_model()
    with torch.no_grad():  # other LoRA weights: the log's state must win over both this model and the checkpoint
        for n, p in model2.named_parameters():
            if "lora_" in n:
                p.add_(0.5)
    opt2 = HiLoOptimizer(model2, ProducerConfig(run=run, log=url, budget=Budget(0.25)), lr=1e-3)
    sched2 = get_linear_schedule_with_warmup(opt2, num_warmup_steps=1, num_training_steps=6)
    trainer2 = _trainer(model2, opt2, sched2, tmp_path, max_steps=6)
    saved = torch.load(tmp_path / "out" / "checkpoint-4" / "optimizer.pt", weights_only=True)  # what Trainer saved
    opt2.load_state_dict(saved)  # (Trainer does this too when it resumes; loading twice at the head changes nothing)
    assert all(torch.equal(a, b)
               for a, b in zip(opt2.producer.builder.encoder.residual, opt.producer.builder.encoder.residual))
    trainer2.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"))
    assert trainer2.state.global_step == 6 and opt2.version == 6
    assert [m.version for m in published(url, run)] == [1, 2, 3, 4, 5, 6]
    # the rates kept following the schedule across the restart (linear decay after one warm-up step)
    assert [round(m.hparams["lr"], 12) for m in published(url, run)] == [round(1e-3 * f, 12)
                                                                         for f in (0, 1, 0.8, 0.6, 0.4, 0.2)]
    assert follower.digest() == opt2.producer.replica.digest.hex()
    assert_model_is_replica(opt2)


def test_trainer_resumed_from_an_older_checkpoint_continues_at_the_log_head(tmp_path, caplog):
    url, run = f"file://{tmp_path}/log", "older"
    model = small_model()
    opt = HiLoOptimizer(model, ProducerConfig(run=run, log=url, budget=Budget(0.25)), lr=1e-3)
    _trainer(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), tmp_path, max_steps=4,
             save_strategy="steps", save_steps=2).train()
    opt2 = HiLoOptimizer(small_model(), ProducerConfig(run=run, log=url, budget=Budget(0.25)), lr=1e-3)
    t2 = _trainer(opt2.producer.model, opt2, torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0), tmp_path,
                  max_steps=5)
    t2.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    # said: the log wins
    assert [r.levelno for r in caplog.records if r.name == "hilo.producer.optimizer"] == [logging.WARNING]
    # 3 more steps, no v3 again
    assert opt2.version == 7 and [m.version for m in published(url, run)] == list(range(1, 8))
    assert_model_is_replica(opt2)


def digits_right(completions, answer, **kw):
    """GRPO's verifiable reward: the share of the answer's characters the completion gets right."""
    return [sum(x == y for x, y in zip(c, a)) / len(a) for c, a in zip(completions, answer)]


def addition_prompts():
    """GRPO's dataset: two-digit additions with their answers."""
    from datasets import Dataset
    pairs = [(a, b) for a in range(10, 50) for b in range(10, 14)]
    return Dataset.from_dict({"prompt": [f"{a:02d}+{b:02d}=" for a, b in pairs],
                              "answer": [f"{a + b:03d};" for a, b in pairs]})


def test_trl_grpo_trainer_with_a_peft_config(tmp_path):
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer
    url, run, steps = f"file://{tmp_path}/log", "grpo", 3
    follower = Follow(url, run, tmp_path, steps)
    dataset = addition_prompts()
    # README: TRL GRPOTrainer
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=4, max_steps=steps, learning_rate=1e-3, use_cpu=True, report_to=[],
                      save_strategy="no", seed=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=build_base(seed=0, hidden=64, layers=2), reward_funcs=digits_right, args=args,
                          train_dataset=dataset, processing_class=build_tokenizer(),
                          peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    opt = HiLoOptimizer(trainer.model, ProducerConfig(run=run, log=url, budget=Budget(0.25)), lr=args.learning_rate)
    trainer.optimizer = opt  # the trainer wraps the model with PEFT first; its scheduler is built on this optimizer
    trainer.train()
    # README: end
    assert trainer.state.global_step == steps and opt.version == steps
    genesis, _ = bootstrap_from_log(open_log(url), run, max_version=0)
    # it learned
    assert any(not torch.equal(a, b) for a, b in zip(genesis.state.params, opt.producer.replica.state.params))
    lrs = [m.hparams["lr"] for m in published(url, run)]
    # GRPOTrainer's linear schedule drove it
    assert len(lrs) == steps and lrs[0] == pytest.approx(1e-3) and lrs[-1] < lrs[0]
    assert follower.digest() == opt.producer.replica.digest.hex()
    assert_model_is_replica(opt)


def test_accelerate_accumulation_and_a_step_the_grad_scaler_skips(tmp_path):
    """Accelerate creates no fp16 GradScaler on CPU (it requires a GPU for fp16); the test installs torch's CPU
    GradScaler in its place, so Accelerate's own scaled backward, unscale, clip and skip logic run. A first scale
    of 2^127 overflows the gradients (fp32 Inf): that step must publish nothing."""
    from accelerate import Accelerator
    url, run = f"file://{tmp_path}/log", "accel"
    follower = Follow(url, run, tmp_path, 3)
    model = small_model()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, backoff_factor=2.0 ** -120,
                                              growth_interval=1000)
    opt = HiLoOptimizer(model, ProducerConfig(run=run, log=url, budget=Budget(0.25)), lr=1e-3)
    data = torch.utils.data.DataLoader(AdditionData(32), batch_size=4)
    model, opt_, data = accelerator.prepare(model, opt, data)
    skipped = []
    for item in data:
        with accelerator.accumulate(model):
            accelerator.backward(model(**item).loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt_.step()
            if accelerator.sync_gradients:
                skipped.append(opt_.step_was_skipped)
            opt_.zero_grad()
    assert skipped == [True, False, False, False] and opt.version == 3  # 8 micro-batches, 4 steps, one skipped
    assert [m.version for m in published(url, run)] == [1, 2, 3]
    assert follower.digest() == opt.producer.replica.digest.hex()
    assert_model_is_replica(opt)


# -- bad input: one clear line each ---------------------------------------------------------------------

def test_a_model_without_lora_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="model has no LoRA parameters for adapter 'default'"):
        HiLoOptimizer(build_base(seed=0, hidden=64, layers=2), ProducerConfig(run="r", log=f"file://{tmp_path}/log"))


def test_an_adapter_unlike_the_runs_is_refused(tmp_path):
    cfg = ProducerConfig(run="r", log=f"file://{tmp_path}/log", budget=Budget(0.25))
    HiLoOptimizer(small_model(), cfg)
    with pytest.raises(LogError, match=r"does not match the run's manifest \(model: .*rank 4.*run: .*rank 8"):
        HiLoOptimizer(small_model(rank=4), cfg)


def test_hyperparameters_the_sites_cannot_run_are_refused(tmp_path):
    cfg = ProducerConfig(run="r", log=f"file://{tmp_path}/log", budget=Budget(0.25), optimizer="adamw")
    with pytest.raises(ConfigError, match=r"\['momentum'\] are not hyperparameters of 'adamw'"):
        HiLoOptimizer(small_model(), cfg, momentum=0.9)
    opt = HiLoOptimizer(small_model(), cfg)
    opt.param_groups[0]["betas"] = (0.8, 0.99)  # torch.optim.AdamW spelling: the sites would not see it
    for p in opt.producer.params:
        p.grad = torch.zeros_like(p)
    with pytest.raises(ConfigError, match=r"param group key\(s\) \['betas'\] cannot be honoured by 'adamw'"):
        opt.step()
    with pytest.raises(ConfigError, match="exactly one param group"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})


def test_a_trainable_parameter_outside_the_adapter_is_refused(tmp_path):
    model = small_model()
    model.base_model.model.lm_head.weight.requires_grad_(True)
    with pytest.raises(ConfigError,
                       match=r"1 trainable parameter\(s\) outside LoRA adapter 'default' would not be replicated"):
        HiLoOptimizer(model, ProducerConfig(run="r", log=f"file://{tmp_path}/log", budget=Budget(0.25)))


def test_step_without_gradients_and_with_nan_are_refused(tmp_path):
    opt = HiLoOptimizer(small_model(), ProducerConfig(run="r", log=f"file://{tmp_path}/log", budget=Budget(0.25)))
    with pytest.raises(TrainerError, match=r"no LoRA parameter has a gradient \(call loss.backward\(\) first"):
        opt.step()
    for p in opt.producer.params:
        p.grad = torch.zeros_like(p)
    opt.producer.params[3].grad[0, 0] = float("nan")
    with pytest.raises(TrainerError, match=r"the gradient of '.*lora_[AB]' has NaN/Inf values; nothing was published"):
        opt.step()
    assert opt.version == 0


def test_the_gradient_check_names_a_nan_block_and_lets_a_finite_one_whose_sum_overflows_through():
    """lora_gradients sums each block first (one pass) and runs the exact check only when a sum is not finite: NaN or
    Inf anywhere is refused with the block's name; finite values whose sum overflows fp32 are not."""
    from hilo.producer.lora_params import lora_gradients, lora_weights
    manifest, weights = lora_weights(small_model())
    grads = [torch.full(b.shape, 0.5) for b in manifest.blocks]
    assert lora_gradients(grads, manifest, "r", "a") is not None
    grads[3][0, 0] = float("nan")
    with pytest.raises(TrainerError, match=f"the gradient of '{re.escape(manifest.blocks[3].key)}' has NaN/Inf"):
        lora_gradients(grads, manifest, "r", "a")
    grads[3].fill_(3e38)  # every value finite, the sum not
    assert len(lora_gradients(grads, manifest, "r", "a")) == len(manifest.blocks)
