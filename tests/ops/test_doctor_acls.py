"""`hilo doctor`'s ACL check on a secured broker of its own (ops/kafka/start.sh --secure: SASL_SSL, SCRAM users admin,
trainer and site, the standard authorizer, nothing allowed by default) on ports 19592-19593: what each principal may
do, as the broker says, against what its role needs (ops/acls.py, what `hilo acls grant` gives)."""
import json

import pytest

from hilo.ops.cli import main
from tests.conftest import new_run
from tests.integration.test_secure import _start, _stop, clients, secured_run

# one worker: ports 19592-19593
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.xdist_group("doctor-secure")]
QUICK = ["--skip", "kernels,cpu,disk"]


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """(url, security dir) of a fresh secured single-node broker; stopped and wiped afterwards."""
    url, sec, env = _start(tmp_path_factory, 19592, 1)
    yield url, sec
    _stop(env)


def doctor(capsys, url, run, user, *args) -> tuple:
    """(exit code, {check: [(status, found, fix)]}) of `hilo doctor` as `user` (admin, trainer or site)."""
    code = main(["doctor", "--log", url, "--run", run, "--kafka-config", user, *args, *QUICK, "--json"])
    rows = {}
    for r in json.loads(capsys.readouterr().out):
        rows.setdefault(r["check"], []).append((r["status"], r["found"], r["fix"]))
    return code, rows


def test_a_granted_principal_passes_and_says_what_it_cannot_tell(secure, capsys):
    url, sec = secure
    run, users = secured_run(url, sec, "docacl"), clients(sec)
    assert main(["topics", "create", "--log", url, "--run", run, "--kafka-config", users["admin"]]) == 0
    capsys.readouterr()
    for role in ("site", "trainer"):
        code, rows = doctor(capsys, url, run, users[role], "--role", role)
        assert code == 0 and [s for s, _, _ in rows["topics"]] == ["WARN", "WARN"]  # one broker: one copy
        status, found, fix = rows["acls"][0]
        # the broker answers for topics and the cluster; groups and transactional ids need DESCRIBE on the cluster to
        # list
        cannot = "its consumer groups and its transactional ids" if role == "site" else \
            "its consumer groups and its transactional ids and the cluster"
        assert status == "WARN" and found.startswith(f"User:{role} ({role}) may do what it needs on the run's topics; "
                                                     f"{cannot}: cannot tell (")
        assert "listing ACLs was refused: ClusterAuthorizationFailedError" in found and (f"hilo acls show --log "
                                                                                         f"{url}") in fix
    code, rows = doctor(capsys, url, run, users["admin"], "--role", "site")  # a super user may do everything
    assert code == 0 and rows["acls"][0][0] == "OK" and "super user" in rows["acls"][0][1]


def test_a_principal_without_its_roles_acls_fails_naming_the_grant(secure, capsys):
    url, sec = secure
    run, users = secured_run(url, sec, "docacl"), clients(sec)
    assert main(["topics", "create", "--log", url, "--run", run, "--kafka-config", users["admin"]]) == 0
    capsys.readouterr()
    # the site's principal cannot move the policy
    code, rows = doctor(capsys, url, run, users["site"], "--role", "trainer")
    status, found, fix = rows["acls"][0]
    # (its operations on the cluster the broker tells only to who may DESCRIBE the cluster)
    assert code == 1 and status == "FAIL" and found == (f"User:site (trainer) lacks topic {run}.updates: CREATE, "
                                                        f"WRITE, DELETE; topic {run}.checkpoints: CREATE, WRITE, "
                                                        f"DELETE")
    assert fix.startswith(f"an admin grants them: hilo acls grant --log {url} --run {run}")
    other = new_run("docnone")  # a run nobody was granted: the site may not even describe its topics
    assert main(["topics", "create", "--log", url, "--run", other, "--kafka-config", users["admin"]]) == 0
    capsys.readouterr()
    code, rows = doctor(capsys, url, other, users["site"])
    assert code == 1 and rows["topics"][0][0] == "FAIL" and "not authorised on the topic" in rows["topics"][0][1]
    assert rows["acls"][0][0] == "FAIL" and f"topic {other}.updates: READ, DESCRIBE, DESCRIBE_CONFIGS" in rows["acls"][
        0][1]


def test_a_wrong_password_fails_at_the_broker(secure, capsys, tmp_path):
    url, sec = secure
    conf = tmp_path / "site.properties"
    conf.write_text("\n".join(line for line in (sec / "clients" / "site.properties").read_text().splitlines()
                              if not line.startswith("sasl.password")) + "\nsasl.password=not-the-password\n")
    code, rows = doctor(capsys, url, "r", str(conf))
    assert code == 1 and rows["kafka-config"][0][0] == "OK" and rows["log"][0][0] == "FAIL"
    assert "user 'site' (SCRAM-SHA-512): check sasl.username and the password" in rows["log"][0][1]
    assert "not-the-password" not in json.dumps(rows)
