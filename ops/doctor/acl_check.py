"""Whether the principal of --kafka-config holds what its role needs for a run (the table of ops/acls.py, what
`hilo acls grant` gives).

On topics the broker says itself which operations this principal may do (the authorized operations of Kafka's
metadata answers), so those are known for any principal; on the cluster it says so only to a principal that may
DESCRIBE it. Consumer groups and transactional ids have no such answer before they exist: there (and on the
cluster, for the others) the principal's ACLs are listed, which also needs DESCRIBE on the cluster; a principal
without it gets a WARN that says what could not be told.
"""
from kafka.admin import ACLFilter, ACLOperation as Op, ACLPermissionType, ACLResourcePatternType as Pattern
from kafka.admin import ResourcePatternFilter, ResourceType as Res
from kafka.errors import KafkaError, SecurityDisabledError

from hilo.log import checkpoints_topic, updates_topic
from hilo.log.kafka_config import client_config
from hilo.ops.acls import acls_for
from hilo.schemas.errors import HiloError, NoSuchTopic

from .base import fail, ok, warn

IMPLY_DESCRIBE = (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER)  # Kafka's authorizer: each of these allows DESCRIBE too
SUPER = {"CLUSTER_ACTION", "ALTER"}  # on the cluster: what brokers and super users may do, and hardly anyone else


def acls(s) -> list:
    """Topics (and the cluster) from the broker's authorized operations; the rest from the principal's listed ACLs."""
    c, admin = s.config, s.log().admin_side
    settings = client_config(c.kafka_config)
    who = (f"User:{settings.sasl_username}" if settings.sasl_username
           else None if settings.ssl_certfile else "User:ANONYMOUS")
    missing, listed = _refused(admin, acls_for(c.run, c.role, who or "User:?"), c.run)
    grant = (f"an admin grants them: hilo acls grant --log {c.log} --run {c.run} --trainer USER --site USER "
             f"--kafka-config ADMIN.properties")
    held = _held(admin, who)
    if held is None and not missing:  # no authorizer: nothing is refused
        return [ok("acls",
                   "the cluster runs no authorizer: every principal may do everything (across sites it needs one: "
                   "docs/operations.md, \"Deploying across sites\")")]
    if not missing and SUPER <= admin.authorized(None):
        return [ok("acls", f"{who or 'this principal'} may do everything on the cluster (a super user)")]
    if isinstance(held, list):
        missing += [a for a in listed if not any(_covers(h, a) for h in held)]
    if missing:
        lacks = {}
        for a in missing:
            lacks.setdefault(_what(a), []).append(a.operation.name)
        return [fail("acls", f"{who or 'this principal'} ({c.role}) lacks "
                     + "; ".join(f"{what}: {', '.join(ops)}" for what, ops in lacks.items()), grant)]
    if isinstance(held, str):
        return [warn("acls", f"{who or 'this principal'} ({c.role}) may do what it needs on the run's topics; "
                             f"{' and '.join(sorted({_kind(a) for a in listed}))}: cannot tell ({held})",
                     f"an admin lists them: hilo acls show --log {c.log} --run {c.run} --kafka-config "
                     f"ADMIN.properties")]
    return [ok("acls", f"{who} holds the {c.role}'s ACLs on the run's topics, groups and transactional ids")]


def _refused(admin, needed: list, run: str) -> tuple:
    """(the needed topic and cluster ACLs the broker says this principal lacks, the group and transactional id ones:
    those it cannot say)."""
    missing, listed = [], []
    allowed = {}  # resource name (None: the cluster) -> the operations the broker says this principal may do
    for acl in needed:
        rp = acl.resource_pattern
        if rp.resource_type not in (Res.TOPIC, Res.CLUSTER):
            listed.append(acl)
            continue
        name = rp.resource_name if rp.resource_type == Res.TOPIC else None
        if name is not None and not _exists(admin, name, run):
            continue
        if name not in allowed:
            allowed[name] = admin.authorized(name)
        if name is None and not allowed[name]:  # the broker names the cluster's operations only to who may DESCRIBE it
            listed.append(acl)
        elif acl.operation.name not in allowed[name]:
            missing.append(acl)
    return missing, listed


def _exists(admin, topic: str, run: str) -> bool:
    """Whether to check `topic`: the policy's topics always (a missing one is the topics check's FAIL), the return
    path's only where the trainer made them (one this principal may not describe is checked: DESCRIBE is missing)."""
    if topic in (updates_topic(run), checkpoints_topic(run)):
        return True
    try:
        admin.partitions(topic)
    except NoSuchTopic:
        return False
    except HiloError:
        pass
    return True


def _held(admin, who):
    """The ALLOW and DENY ACLs of `who` and of User:*; None where the cluster runs no authorizer; a str saying why they
    cannot be listed."""
    if who is None:
        return "the principal of a client certificate is the broker's mapping of its subject"
    out = []
    for principal in (who, "User:*"):
        flt = ACLFilter(principal=principal, host=None, operation=Op.ANY, permission_type=ACLPermissionType.ANY,
                        resource_pattern=ResourcePatternFilter(Res.ANY, None, Pattern.ANY))
        try:
            found, err = admin.client.describe_acls(flt)
        except SecurityDisabledError:
            return None
        except KafkaError as e:
            err = e
        if getattr(err, "errno", 0):
            return f"listing ACLs was refused: {type(err).__name__ if not isinstance(err, type) else err.__name__}; " \
                   f"it needs DESCRIBE on the cluster"
        out += found
    return out


def _covers(held, need) -> bool:
    """Whether one held ACL allows the needed one (same resource type; a literal '*', the same literal name, or a prefix
    of the needed name or prefix; the operation itself, ALL, or one that implies DESCRIBE)."""
    hp, rp = held.resource_pattern, need.resource_pattern
    if held.permission_type != ACLPermissionType.ALLOW or hp.resource_type != rp.resource_type:
        return False
    if held.operation not in (need.operation,
                              Op.ALL) and not (need.operation == Op.DESCRIBE and held.operation in IMPLY_DESCRIBE):
        return False
    if hp.pattern_type == Pattern.PREFIXED:
        return rp.resource_name.startswith(hp.resource_name)
    return hp.resource_name == "*" or (rp.pattern_type == Pattern.LITERAL and hp.resource_name == rp.resource_name)


def _kind(acl) -> str:
    return {Res.CLUSTER: "the cluster", Res.GROUP: "its consumer groups"}.get(acl.resource_pattern.resource_type,
                                                                             "its transactional ids")


def _what(acl) -> str:
    rp = acl.resource_pattern
    kind = rp.resource_type.name.lower().replace("_", " ")
    return "the cluster" if rp.resource_type == Res.CLUSTER else \
        f"{kind} {rp.resource_name}{'*' if rp.pattern_type == Pattern.PREFIXED else ''}"
