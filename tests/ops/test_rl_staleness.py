"""`hilo rl`'s loop with S = 1 across a trainer restart: no trained sample is more than S behind the version that
trained it, by the trainer's own record (its ledger and the rollouts on the log) and by what its JSON rows report.

The loop's parts (ops/rl.gather, staleness_row) run against the real embedded log; the site is played by the test,
which answers RUN.prompts as `hilo consume --generate` would (the real one needs a vLLM server)."""
import itertools
import json
import re
import logging

from hilo.log.base import prompts_topic, rollouts_topic
from hilo.log.tail import records
from hilo.ops.digit_task import prompts
from hilo.ops.rl import gather, staleness_row
from hilo.producer.rollout_book import RolloutPolicy
from hilo.producer.rollout_exchange import RolloutExchange
from hilo.producer.rollout_ledger import RolloutLedger
from hilo.schemas.rollouts import RolloutRecord, Sampling, decode_rollout_record
from tests.conftest import new_run

S, B, N = 1, 2, 2


class Site:
    """Answers every prompt on RUN.prompts once, all n samples, with the policy version it serves (`version`)."""

    def __init__(self, log, run):
        self.log, self.run, self.version, self.answered = log, run, 0, set()

    def answer(self, only=None) -> None:
        """One pass over the prompts (those in `only`, when given), as a site between versions."""
        topic = prompts_topic(self.run)
        for part in range(self.log.partitions(topic)):
            for rec in records(self.log, topic, part, start=0):
                p = decode_rollout_record(rec.value, "prompt")
                if p.prompt_id in self.answered or (only is not None and p.prompt_id not in only):
                    continue
                self.answered.add(p.prompt_id)
                self.log.append(rollouts_topic(self.run), [
                    (p.prompt_id.encode(),
                     RolloutRecord(self.run, p.prompt_id, s, "site-1", self.version, self.version, (7,),
                                                         (-0.1,), float(s % 2), "hilo.ops.digit_task:reward",
                                   "stop").to_bytes(), {})
                    for s in range(p.sampling.n)])


class Trainer:
    """ops/rl.py's loop around the exchange (the GRPO step itself is not the point: publishing is version += 1)."""

    def __init__(self, log, run, ledger_path, version=0):
        self.version, self.ready, self.rows = version, [], []
        self.exchange = RolloutExchange.open(log, run, RolloutPolicy(batch_prompts=B, max_staleness=S),
                                             prompt_partitions=2,
                                        ledger=RolloutLedger(ledger_path))
        if version:
            self.exchange.restore(version)
        self.source = itertools.islice(prompts(run, Sampling(N, 1.0, 1.0, 4, 0), 0, min_version=self.min_version),
                                       self.exchange.issued, None)

    def min_version(self):
        queued = len(self.ready) + len(self.exchange.book.in_flight)
        return max(0, self.version + queued // B - S)

    def step(self, answer) -> list:
        """One step: B groups gathered at this version (answer() between polls), trained, recorded, published."""
        groups = gather(self.exchange, self.source, self.version, self.ready, B, check=answer, poll_s=0.2)
        self.exchange.record_step(self.version + 1, groups)
        self.rows.append({"step": self.version + 1, **staleness_row(groups)})
        self.version += 1
        return groups


def test_a_restarted_trainer_trains_no_sample_more_than_s_behind_and_reports_what_it_trained(tmp_path, log_url, caplog,
                                                                                             logs):
    # On Kafka (prompts over 2 partitions) the restarted trainer used to hold p-2, p-4, p-3, p-5 (partition order) and
    # train p-3 at v2, 2 behind, reported 1; on either log it reported the staleness a group had on arrival
    log, run, ledger = logs(log_url), new_run("rlstale"), str(tmp_path / "trainer" / "rollouts.jsonl")
    log.create_topics(run)
    site = Site(log, run)
    first = Trainer(log, run, ledger)
    trained = {1: first.step(lambda: site.answer({"p-0", "p-1"}))}  # p-2, p-3 are held by a site that was killed
    assert first.exchange.issue(first.source) == 2    # p-4, p-5 (for v1 or newer); then the trainer is killed too
    site.answer({"p-2", "p-3"})                       # the killed site's prompts, answered by its restart still at v0
    site.version = 1
    site.answer()                                     # p-4, p-5 at v1
    with caplog.at_level(logging.WARNING, logger="hilo.producer.rollout_exchange"):
        again = Trainer(log, run, ledger, version=1)  # restarted: every prompt in flight completes at once
        assert again.exchange.restored == {"trained": 2, "retired": 0, "in_flight": 4, "rollouts": 8}
        trained[2] = again.step(site.answer)          # the oldest issued first: p-2, p-3, 1 behind
        site.version = 2
        trained[3] = again.step(site.answer)          # p-4, p-5, 1 behind (they waited in the exchange, checked at v2)
    rows = first.rows + again.rows

    # the trainer's own record: the ledger says which prompts each version trained; the log holds their samples
    version_start = {}
    for rec in records(log, rollouts_topic(run), start=0):
        r = decode_rollout_record(rec.value, "rollout")
        version_start[(r.prompt_id, r.sample)] = r.version_start
    ledger_lines = {}
    for line in (tmp_path / "trainer" / "rollouts.jsonl").read_text().splitlines():
        e = json.loads(line)
        ledger_lines[e["v"]] = e
    behind = {v: [v - 1 - version_start[(pid, s)] for pid in ledger_lines[v]["trained"] for s in range(N)]
              for v in (1, 2, 3)}
    assert {v: sorted(g.prompt.prompt_id for g in trained[v]) for v in trained} == {v: ledger_lines[v]["trained"]
                                                                                    for v in trained}
    assert all(0 <= b <= S for v in behind for b in behind[v]), behind
    # ... and what the JSON rows report is what was trained
    for row in rows:
        v = row["step"]
        assert row["staleness_counts"] == {str(b): behind[v].count(b) for b in sorted(set(behind[v]))}, (row, behind)
        assert [s for g in trained[v] for s in g.staleness] == [v - 1 - x.version_start for g in trained[v]
                                                                for x in g.rollouts]
    assert {v: ledger_lines[v]["trained"] for v in trained} == {1: ["p-0", "p-1"], 2: ["p-2", "p-3"], 3: ["p-4", "p-5"]}
    refusals = [r.getMessage() for r in caplog.records if r.name == "hilo.producer.rollout_exchange"]
    assert dict(again.exchange.book.dropped) == {} and not refusals, refusals  # nothing wasted: the oldest went first


def test_a_run_that_no_site_answers_stops_after_stall_s_saying_what_is_in_flight(tmp_path, capsys):
    """`hilo rl --stall-s`: no site answers, so no group completes; the trainer stops with one line naming the step,
    the prompts in flight and what was dropped (a quarantined site that answers everything shows there too)."""
    from hilo.ops.cli import main
    assert main(["rl", "--sites", "0", "--log", f"file://{tmp_path}/log", "--steps", "1", "--batch-prompts", "1",
                 "--samples", "2", "--stall-s", "1"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(r"no complete group for 1 s at step 1 \((\d+) prompts in flight of \1 issued; rollouts dropped: "
                     r"none\); the sites' logs are in ", line), line
