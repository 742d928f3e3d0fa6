"""Each test's CPU time, as the `cpu_s` property of its JUnit record: the worker's own CPU over setup, call and
teardown, plus that of the processes the test started and reaped (a `hilo` CLI, a torchrun job). The suite is
CPU-bound on 2 cores, so this, not wall time, says which test to make cheaper (the vLLM servers and brokers
started by ops/test.sh are not counted: they are nobody's child)."""
import resource

import pytest


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children, user and system."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Mark the CPU clock before the test's setup."""
    item.stash[_START] = _cpu_s()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Before the teardown report is made (JUnit writes properties from it), record the CPU used since setup."""
    if call.when == "teardown" and _START in item.stash:
        item.user_properties.append(("cpu_s", round(_cpu_s() - item.stash[_START], 2)))
    return (yield)


_START = pytest.StashKey[float]()
