"""`hilo doctor`: is this machine ready for a run? One line per check, OK / WARN / FAIL and what to do.

CHECKS is the registry the CLI, the docs table and the tests read: each check names the options it needs (it runs
only where they are given) and the checks it builds on (it is SKIPped where one of them failed), and returns a
list of Results. An operator error a check meets (HiloError: a refused connection, a missing topic) is its FAIL.
"""
from dataclasses import dataclass
from collections.abc import Callable

from hilo.schemas.errors import HiloError

from . import acl_check, log_checks, machine_checks, vllm_checks
from .base import DoctorConfig, Result, Session, Status, fail  # noqa: F401  (the package's interface)


@dataclass(frozen=True)
class Check:
    """One entry of the registry."""

    name: str
    needs: tuple      # DoctorConfig fields that must be given ("kafka": --log names a Kafka cluster)
    after: tuple      # checks that must have passed (not FAIL or SKIP)
    run: Callable     # Session -> [Result]
    about: str        # one line for the docs


CHECKS = (
    Check("kafka-config", ("kafka_config",), (), log_checks.kafka_config,
          "the client file parses: known keys, readable certificate and password files, complete SASL settings"),
    Check("log", ("log",), ("kafka-config",), log_checks.reach,
          "the broker answers with those settings (brokers, controller, cluster id); a file log's directory exists"),
    Check("topics", ("log", "run"), ("log",), log_checks.topics,
          "one line per topic of the run: partitions (1 where order matters), delete policy, room for a chunk, "
          "replication against min.insync.replicas, retention"),
    Check("acls", ("run", "kafka"), ("log",), acl_check.acls,
          "the principal holds its role's ACLs (`--role`): on topics as the broker reports them; on the cluster, "
          "groups and transactional ids from what the broker tells it or its listed ACLs (WARN where it may not see "
          "them)"),
    Check("vllm", ("vllm",), (), vllm_checks.version,
          "the server answers and is vLLM; WARN on a release the plugin does "
          "not patch"),
    Check("vllm-lora", ("vllm",), ("vllm",), vllm_checks.lora,
          "runtime LoRA loading is on (asked without loading anything)"),
    Check("vllm-plugin", ("vllm",), ("vllm-lora",), vllm_checks.plugin,
          "the hilo-sync plugin answers an in-place load of the state dir's newest adapter (or one the server holds), "
          "which is then unloaded"),
    Check("vllm-base", ("vllm",), ("vllm",), vllm_checks.base,
          "the base model it serves; FAIL where `--base` names another"),
    Check("kernels", (), (), machine_checks.kernels,
          "the fused apply kernel compiles (or loads from numba's cache; how long it took) and one update's state "
          "equals the torch path's"),
    Check("cpu", (), (), machine_checks.cpu,
          "the instruction sets the kernels are compiled for (avx512f, avx2, fma, sse4_2)"),
    Check("disk", (), (), machine_checks.disk,
          "free space in `--state-dir` and a file:// `--log`'s directory, where given "
          "(WARN under `--min-free-gb`)"),
)
NAMES = tuple(c.name for c in CHECKS)


def _given(config: DoctorConfig, need: str) -> bool:
    return (config.log or "").startswith("kafka://") if need == "kafka" else getattr(config, need) is not None


def run_checks(config: DoctorConfig, skip=()):
    """Yield each check's Results in the registry's order, as they come (a slow check shows the ones before it)."""
    session, verdicts = Session(config), {}
    try:
        for check in CHECKS:
            if check.name in skip or not all(_given(config, n) for n in check.needs):
                continue
            blocked = next((a for a in check.after if verdicts.get(a) in (Status.FAIL, Status.SKIP)), None)
            if blocked is not None:
                why = "failed" if verdicts[blocked] is Status.FAIL else "was not checked"
                results = [Result(check.name, Status.SKIP, f"not checked: {blocked} {why}")]
            else:
                try:
                    results = check.run(session)
                except HiloError as e:
                    results = [fail(check.name, str(e))]
            worst = [r.status for r in results]
            verdicts[check.name] = next((st for st in (Status.FAIL, Status.SKIP, Status.WARN) if st in worst),
                                        Status.OK)
            yield from results
    finally:
        session.close()
