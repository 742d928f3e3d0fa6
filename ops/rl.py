"""`hilo rl`: a GRPO run across sites on the digit task: this process trains, N `hilo consume --generate` sites answer.

    hilo rl --vllm http://127.0.0.1:8011 --sites 2 --staleness 2 --steps 20      # embedded log in a temp folder

The trainer is a tiny Qwen3 + LoRA (--base: the random one the tests serve, or the student pretrained on the
task, ops/rl_bases.py; the vLLM servers must serve the same base, and the run checks that) under HiLoProducer;
it issues digit-task prompts through a RolloutExchange (at most (S + 1) * B in flight), waits for B complete
groups, takes one GRPO step (group-normalised advantages, token-level truncated importance weights from
vLLM's behaviour log-probabilities) and publishes it. The sites apply every version, serve it through vLLM
(each under its own adapter name) and answer prompts between versions. It prints one line per step (reward,
staleness, prompts in flight, each site's lag) and ends with a table and every site's digest against the
trainer's; exit 0 only if they are equal.
"""
import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

from hilo.consumer.generator import load_reward
from hilo.consumer.vllm_serving import VllmServer
from hilo.ops.digit_task import prompts
from hilo.ops.lag import lag_rows
from hilo.ops.rl_bases import base as rl_base
from hilo.ops.tiny_trainer import with_lora
from hilo.producer.importance import mismatch_kl
from hilo.producer.config import ProducerConfig
from hilo.producer.producer import HiLoProducer
from hilo.producer.audit_verdicts import VerdictStore
from hilo.producer.rollout_audit import AuditConfig, Auditor
from hilo.producer.rollout_book import RolloutPolicy
from hilo.producer.rollout_exchange import RolloutExchange
from hilo.producer.rollout_ledger import RolloutLedger
from hilo.replica.codecs import Budget
from hilo.replica.forward import completion_logprobs
from hilo.schemas.errors import ConfigError, HiloError, LogUnavailable
from hilo.schemas.options import opt
from hilo.schemas.rollouts import Sampling

REWARD = "hilo.ops.digit_task:reward"


@dataclass(frozen=True)
class RLConfig:
    """One GRPO run across sites: the vLLM servers and base, the log and run (resumable with a state dir), how many
    sites generate, the staleness bound, the GRPO batch and the trainer's optimizer and compression; checked at
    construction. Each field's help is in its metadata (`hilo rl --help`, docs/cli.md)."""

    vllm: str | None = opt(None,
                           "base URL of the vLLM server the sites generate with (ops/vllm/start.sh), or a comma list: "
                           "site i uses the i-th (modulo), so each site can have its own server. Not needed with sites "
                           "= 0 (the sites run elsewhere; given, it is checked)")
    base: str = opt("tiny",
                    "the model trained and served: tiny (random; reward stays ~0) or student (pretrained on the digit "
                    "task; ops/rl_bases.py). The servers must serve it: python -m hilo.ops.rl_bases NAME prints the "
                    "directory")
    log: str | None = opt(None, "the log URL (none: a file:// log in a temp folder)")
    run: str | None = opt(None, "the run id; with state_dir, the run to resume (none: a new one, rl-TIME-PID)")
    state_dir: str | None = opt(None, "the trainer's state (its snapshot, the rollout ledger, "
                                "producer/rollout_ledger.py, and the audit's verdicts, producer/audit_verdicts.py): "
                                "a restarted `hilo rl` with the same run and state dir continues where the log says it "
                                "was, training on no group twice, losing no prompt in flight and still refusing a site "
                                "it quarantined")
    sites: int = opt(2, "how many generating sites this command starts (0: sites started elsewhere answer)")
    prompt_partitions: int = opt(4, "partitions of RUN.prompts on Kafka (at most this many sites share the prompts)")
    staleness: int = opt(2, "S, how many versions a sample's policy may trail the trainer's (0: synchronous)")
    steps: int = opt(20, "optimizer steps (versions published)")
    batch_prompts: int = opt(4, "B, complete groups per step")
    samples: int = opt(4, "n, samples per prompt (the GRPO group)")
    lr: float = opt(3e-3, "the trainer's learning rate (AdamW)")
    codec: str = opt("spar4", "how versions are compressed")
    budget: float = opt(0.016, "bytes per version as a fraction of the bf16 adapter")
    seed: int = opt(0, "prompts and sampling seeds")
    reward: str = opt(REWARD, "MODULE:FUNCTION of the reward")
    trainer_threads: int = opt(1, "torch threads of the trainer. On one machine it shares the cores with the sites and "
                               "vLLM, and OpenMP threads that outnumber free cores spin: on 2 cores, 2 threads made a "
                               "run 1.6x slower")
    stall_s: float = opt(300.0, "stop (exit 1, saying what was in flight and dropped) when no complete group came for "
                         "this many seconds: the sites are not answering, or only a quarantined one is")
    audit: AuditConfig = opt(help="how the trainer audits the sites' rollouts (producer/rollout_audit.py): the share, "
                             "the tolerance, the quarantine threshold", factory=AuditConfig)

    def __post_init__(self):
        for name, lo in (("sites", 0), ("prompt_partitions", 1), ("steps", 1), ("batch_prompts", 1), ("samples", 2),
                         ("staleness", 0), ("trainer_threads", 1), ("stall_s", 1)):
            if getattr(self, name) < lo:
                raise ConfigError(f"RLConfig.{name} = {getattr(self, name)}: must be >= {lo}")
        if self.vllm is None and self.sites == 0:
            pass  # the sites run elsewhere, each checking its own server
        elif not isinstance(self.vllm,
                            str) or not all(u.startswith(("http://", "https://")) for u in self.vllm.split(",")):
            raise ConfigError(f"RLConfig.vllm = {self.vllm!r}: expected the http:// URL of a running vLLM server "
                              f"(--vllm URL; ops/vllm/start.sh starts one)")
        rl_base(self.base)

    @property
    def servers(self) -> list:
        """The vLLM URLs, one per server."""
        return self.vllm.split(",") if self.vllm else []


def grpo_loss(model, exchange, groups) -> tuple:
    """(loss, stats) of one GRPO step over complete groups: advantage (r - mean) / (std + 1e-4) per group, each token's
    log-probability weighted by its truncated importance weight (behaviour: vLLM's), mean over samples."""
    terms, rewards, truncated, kl = [], [], [], []
    logps = iter(completion_logprobs(model,
                                     [(g.prompt.token_ids, x.completion_ids) for g in groups for x in g.rollouts]))
    for g in groups:
        r = torch.tensor([x.reward for x in g.rollouts], dtype=torch.float32)
        adv = (r - r.mean()) / (r.std() + 1e-4)
        lps = [next(logps) for _ in g.rollouts]
        for (w, frac), lp, a, x in zip(exchange.weights(g, lps), lps, adv, g.rollouts):
            terms.append(-(w * a * lp).mean())
            truncated.append(frac)
            kl.append(mismatch_kl(lp, torch.tensor(x.logprobs, dtype=torch.float64)))
        rewards += r.tolist()
    loss = torch.stack(terms).mean()
    return loss, {"reward": sum(rewards) / len(rewards), "truncated": sum(truncated) / len(truncated),
                  "mismatch_kl": sum(kl) / len(kl)}


def gather(exchange, source, version: int, ready: list, batch_prompts: int, check=lambda: None,
           poll_s: float = 0.2) -> list:
    """The `batch_prompts` complete groups the step at `version` trains on, collected in `ready` (the caller's
    min_version counts them as queued ahead); issues prompts while admission control has room and calls check()
    between polls (it raises to give up). It takes no more groups than the step needs: the exchange keeps the rest
    and checks their staleness against the version that trains them (held here, they were trained a version later
    than checked, one more behind than reported)."""
    while len(ready) < batch_prompts:
        exchange.issue(source)
        ready += exchange.poll(version, timeout_s=poll_s, most=batch_prompts - len(ready))
        check()
    groups = list(ready)
    ready.clear()
    return groups


def staleness_row(groups) -> dict:
    """What a step's row reports of the staleness it trained with: the mean and the count of each value."""
    stale = [s for g in groups for s in g.staleness]
    return {"staleness": round(sum(stale) / len(stale), 2),
            "staleness_counts": {str(k): stale.count(k) for k in sorted(set(stale))}}


def check_servers(cfg: RLConfig) -> None:
    """Every server answers, is vLLM and serves cfg.base (else a HiloError naming the server and what it serves)."""
    want = rl_base(cfg.base).dir_name
    for url in cfg.servers:
        server = VllmServer(url)
        server.check()
        served = server.base_model()
        if os.path.basename(served.rstrip("/")) != want:
            raise HiloError(f"vLLM at {url} serves {served}, not the base {cfg.base!r} the trainer trains ({want}; "
                            f"python -m hilo.ops.rl_bases {cfg.base} writes it, ops/vllm/start.sh DIR serves it)")


def last_words(log_path: str, lines: int = 6) -> str:
    """The tail of a site's log, indented, so the line that says a site exited also says why."""
    try:
        with open(log_path, errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
    except OSError:
        return ""
    return "".join(f"\n    | {line}" for line in tail)


def _site(cfg, vllm, url, run, name, work):
    """One `hilo consume --generate` process; its log in WORK/NAME.log."""
    cmd = [sys.executable, "-m", "hilo.ops.cli", "consume", "--log", url, "--run", run, "--site", name,
           "--state-dir", f"{work}/{name}", "--vllm", vllm, "--lora-name", f"{run}-{name}", "--export-dtype", "float32",
           "--generate", "--reward", cfg.reward, "--generate-batch", "2", "--until-version", str(cfg.steps),
           "--no-progress",
           "--wait-checkpoint", "300"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(f"{work}/{name}.log", "w"), text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


def stall_state(exchange, auditor) -> str:
    """What a stalled run knows: prompts in flight, rollouts dropped by reason, each audited site's verdict."""
    dropped = ", ".join(f"{k} {n}" for k, n in sorted(exchange.book.dropped.items()) if n) or "none"
    verdicts = auditor.verdicts.values() if auditor is not None else ()
    sites = "".join(f"; site {v.site}: {v.audited} audited, {v.refused} refused, {v.failed} failed"
                    + (", quarantined" if v.quarantined else "") for v in verdicts)
    flight = f"{len(exchange.book.in_flight)} prompts in flight of {exchange.issued} issued"
    return f"{flight}; rollouts dropped: {dropped}{sites}"


def run_rl(cfg: RLConfig, as_json: bool = False, out=sys.stdout) -> int:
    """Run it; the exit code (0: every site's digest equals the trainer's)."""
    load_reward(cfg.reward)  # a reward that does not import fails here, before anything starts
    check_servers(cfg)  # so does a server that is not there, not vLLM or serving another base
    work = tempfile.mkdtemp(prefix="hilo-rl-")
    url = cfg.log or f"file://{work}/log"
    run = cfg.run or f"rl-{int(time.time())}-{os.getpid()}"
    say = ((lambda *a: print(*a, file=sys.stderr, flush=True)) if as_json
           else (lambda *a: print(*a, file=out, flush=True)))
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.trainer_threads)
    model = with_lora(rl_base(cfg.base).model())
    producer = HiLoProducer.open(model, ProducerConfig(run=run, log=url, codec=cfg.codec, budget=Budget(cfg.budget),
                                                       optimizer="adamw",
                                                  state_dir=cfg.state_dir))
    policy = RolloutPolicy(batch_prompts=cfg.batch_prompts, max_staleness=cfg.staleness)
    ledger = RolloutLedger(f"{cfg.state_dir}/rollouts.jsonl") if cfg.state_dir else None
    auditor = None
    if cfg.audit.share > 0:  # keeps the params of the last S + 1 versions: a rollout older than those is stale anyway
        store = VerdictStore(f"{cfg.state_dir}/audit.json") if cfg.state_dir else None  # a restart keeps the verdicts
        auditor = Auditor(cfg.audit, model, producer.manifest, cfg.staleness + 1, producer.metrics, store=store)
        auditor.remember(producer.version, producer.replica.state.params)
    exchange = RolloutExchange.open(producer.log, run, policy, prompt_partitions=max(cfg.prompt_partitions, cfg.sites),
                                    metrics=producer.metrics, ledger=ledger, auditor=auditor)
    if ledger is not None:
        exchange.restore(producer.version)
    ready = []

    def min_version():
        # the k-th prompt queued ahead (complete or in flight) is trained when the trainer is at version
        # producer.version + k // B; asking for a policy at most S older keeps its samples from aging out
        # (S = 0: a prompt issued while the current batch completes waits for the next version, it is not wasted).
        # Unless the current step still lacks groups that the prompts ahead can give: prompts were dropped (stale,
        # audit-failed, quarantined) and this one replaces one the step needs, so it must be answerable now; asking for
        # a later version there left every prompt in flight waiting for a version only they could make (a deadlock)
        now = producer.version
        answerable = sum(1 for p in exchange.book.in_flight.values() if p.min_version <= now)
        if len(ready) + answerable < cfg.batch_prompts:
            return max(0, now - cfg.staleness)
        return max(0, now + (len(ready) + len(exchange.book.in_flight)) // cfg.batch_prompts - cfg.staleness)

    source = itertools.islice(prompts(run, Sampling(cfg.samples, 1.0, 1.0, 4, cfg.seed), cfg.seed,
                                      min_version=min_version),
                              exchange.issued, None)
    names = [f"site-{i + 1}" for i in range(cfg.sites)]
    say(f"hilo rl: run {run}, log {url}, {cfg.sites} sites on {cfg.vllm}, S = {cfg.staleness}, B = "
        f"{cfg.batch_prompts}, n = {cfg.samples}, {cfg.steps} steps; work dir {work}")
    procs = {n: _site(cfg, cfg.servers[i % len(cfg.servers)], url, run, n, work) for i, n in enumerate(names)}
    rows, t0, idle, gone = [], time.monotonic(), 0.0, set()
    try:
        while producer.version < cfg.steps:
            waited = time.monotonic()

            def going(waited=waited):
                dead = [n for n, p in procs.items() if p.poll() is not None]
                for n in sorted(set(dead) - gone):  # said once; the group moves its prompts to the others
                    gone.add(n)
                    say(f"hilo rl: {n} exited ({procs[n].returncode}) at step {producer.version + 1}; the other sites "
                        f"take its prompts (its log: {work}/{n}.log){last_words(f'{work}/{n}.log')}")
                if procs and len(dead) == len(procs):
                    raise HiloError(f"every site exited (see {work}/site-*.log)")
                if time.monotonic() - waited > cfg.stall_s:
                    raise HiloError(f"no complete group for {cfg.stall_s:g} s at step {producer.version + 1} "
                                    f"({stall_state(exchange, auditor)}); the sites' logs are in {work}")
            audited_s = auditor.seconds if auditor else 0.0
            groups = gather(exchange, source, producer.version, ready, cfg.batch_prompts, going)  # waits out outages
            wait_s = time.monotonic() - waited
            # part of the wait: the trainer audits while it waits
            audit_s = (auditor.seconds if auditor else 0.0) - audited_s
            step_t0 = time.monotonic()
            idle += wait_s
            exchange.record_step(producer.version + 1, groups)  # before the version is published (propose, then commit)
            loss, stats = grpo_loss(model, exchange, groups)
            loss.backward()
            producer.step(lr=cfg.lr)
            train_s = time.monotonic() - step_t0
            if auditor is not None:
                auditor.remember(producer.version, producer.replica.state.params)
            published_at, nbytes = time.time(), producer.last_step["bytes"]
            try:
                lags = {r["site"]: r["lag"] for r in lag_rows(producer.log, run)}
            except LogUnavailable:  # the version is published; the row shows no lag
                lags = {}
            row = {"step": producer.version, "reward": round(stats["reward"], 4), **staleness_row(groups),
                   "in_flight": len(exchange.book.in_flight), "truncated": round(stats["truncated"], 4),
                   "mismatch_kl": stats["mismatch_kl"], "lag": {n: lags.get(n) for n in names},
                   "wait_s": round(wait_s, 3),
                   "train_s": round(train_s, 3), "audit_s": round(audit_s, 4), "bytes": nbytes,
                   "rollouts": sum(len(g.rollouts) for g in groups), "published_at": published_at,
                   "t": round(time.monotonic() - t0, 2)}
            rows.append(row)
            say(f"step {row['step']:3d}  reward {row['reward']:.3f}  staleness {row['staleness']:.2f}  in flight "
                f"{row['in_flight']}  lag " + " ".join(f"{n}={row['lag'][n]}" for n in names))
        digests = {}
        for n, p in procs.items():
            stdout, _ = p.communicate(timeout=300)
            m = re.search(r"digest ([0-9a-f]{32})", stdout or "")
            digests[n] = m.group(1) if m and p.returncode == 0 else f"exit {p.returncode} (see {work}/{n}.log)"
    finally:
        for p in procs.values():
            if p.poll() is None:  # a site still running now is stuck or being stopped: its stacks go to its log first
                p.send_signal(signal.SIGUSR1)
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=60)
        producer.close()
    mine = producer.replica.digest.hex()
    ok = all(d == mine for d in digests.values())
    wall = time.monotonic() - t0
    summary = {"run": run, "config": dataclasses.asdict(cfg), "steps": rows, "wall_s": round(wall, 2),
               "version": producer.version,
               "restored": exchange.restored, "issued": exchange.issued,
               "in_flight": sorted(set(exchange.book.in_flight) - set(exchange.book.complete())),
               "complete_unused": sorted(exchange.book.complete()),  # complete after the last step needed them
               "trainer_idle_fraction": round(idle / wall, 3),
               "longest_wait_s": max((r["wait_s"] for r in rows), default=0.0),
               "dropped": dict(exchange.book.dropped), "adapter_bytes": producer.manifest.adapter_bytes(),
               "work_dir": work,
               "trainer_digest": mine, "site_digests": digests, "ok": ok,
               "audit": auditor.summary() if auditor else None}
    say(f"\n{'site':10s} {'digest':34s} match")
    for n, d in digests.items():
        say(f"{n:10s} {d[:32]:34s} {'yes' if d == mine else 'NO'}")
    say(f"{'trainer':10s} {mine:34s}\nwall {wall:.1f} s, trainer idle {100 * idle / wall:.0f}% (longest wait for a "
        f"batch {summary['longest_wait_s']:.1f} s), dropped "
        f"{dict(exchange.book.dropped) or 'none'}; {'OK' if ok else 'DIGESTS DIFFER'}")
    if auditor is not None:
        for n, v in sorted(auditor.verdicts.items()):
            say(f"audit {n}: {v.audited} audited, {v.passed} passed, {v.failed} failed, worst difference {v.worst:.3g} "
                f"(tolerance {'measured' if cfg.audit.tolerance is None else format(cfg.audit.tolerance, 'g')}), "
                f"statistical verdict z {v.noise_z:+.2f} over {v.noise_tokens} tokens, sampling z {v.z:+.2f} over "
                f"{v.tokens} tokens"
                + (f", {v.refused} refused by their version stamps" if v.refused else "")
                + (f"; served by {v.served}" if v.served else "") + (f"; QUARANTINED: {v.evidence}" if v.quarantined
                                                                     else ""))
        say(f"audit: {auditor.seconds:.2f} s of the trainer's time ({100 * auditor.seconds / wall:.1f}% of the run), "
            f"{auditor.kept_bytes:,} bytes of params kept for {len(auditor.versions)} versions; probes of quarantined "
            f"sites {auditor.probe_seconds:.2f} s (at most {100 * cfg.audit.probe_share:g}% of the time), "
            f"{auditor.probes_skipped} probe rollouts dropped unaudited over that budget")
    if as_json:
        print(json.dumps(summary), file=out)
    return 0 if ok else 1
