"""The Kafka ACLs of a run, as a table: the trainer moves the policy and issues prompts; sites read the policy and the
prompts, keep their position, and write rollouts only.

`hilo acls grant --run RUN --trainer USER --site USER --kafka-config admin.properties` creates them with the
admin API; `hilo acls show` lists what the cluster holds for the run. The table is what both read.
"""
from kafka.admin import ACL, ACLFilter, ACLOperation as Op, ACLPermissionType, ACLResourcePatternType as Pattern
from kafka.admin import ResourcePattern, ResourcePatternFilter, ResourceType as Res

from hilo.log import checkpoints_topic, site_group, updates_topic
from hilo.log.base import prompts_topic, rollouts_topic
from hilo.log.prompt_queue import generate_group
from hilo.schemas.errors import ConfigError, LogError

# role -> [(resource type, name template, pattern type, operations)]; {run} is the run id.
GRANTS = {
    "trainer": [
        (Res.TOPIC, "{updates}", Pattern.LITERAL,
         (Op.CREATE, Op.WRITE, Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.DELETE)),
        (Res.TOPIC, "{checkpoints}", Pattern.LITERAL,
         (Op.CREATE, Op.WRITE, Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.DELETE)),
        (Res.TOPIC, "{prompts}", Pattern.LITERAL,
         (Op.CREATE, Op.WRITE, Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.DELETE)),
        # reads them only
        (Res.TOPIC, "{rollouts}", Pattern.LITERAL, (Op.CREATE, Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.DELETE)),
        (Res.TRANSACTIONAL_ID, "hilo.{run}", Pattern.LITERAL, (Op.WRITE, Op.DESCRIBE)),    # its transactional producer
        (Res.GROUP, "{groups}", Pattern.PREFIXED, (Op.DESCRIBE,)),              # sites' positions, on a restart
        (Res.CLUSTER, "kafka-cluster", Pattern.LITERAL, (Op.DESCRIBE_CONFIGS, Op.IDEMPOTENT_WRITE)),  # chunk-size check
    ],
    "site": [
        (Res.TOPIC, "{updates}", Pattern.LITERAL, (Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS)),
        (Res.TOPIC, "{checkpoints}", Pattern.LITERAL, (Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS)),
        # its hilo.RUN.SITE group, hilo.RUN.generate
        (Res.GROUP, "{groups}", Pattern.PREFIXED, (Op.READ, Op.DESCRIBE)),
        # the return path: take prompts, write rollouts only (never the policy's topics), under its own transactional id
        (Res.TOPIC, "{prompts}", Pattern.LITERAL, (Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS)),
        (Res.TOPIC, "{rollouts}", Pattern.LITERAL, (Op.WRITE, Op.DESCRIBE, Op.DESCRIBE_CONFIGS)),
        (Res.TRANSACTIONAL_ID, "{generate}.", Pattern.PREFIXED, (Op.WRITE, Op.DESCRIBE)),  # hilo.RUN.generate.SITE
    ],
}


def acls_for(run: str, role: str, principal: str) -> list:
    """The ACL objects the table gives `principal` (User:NAME) in `role` for `run`."""
    names = {"run": run, "updates": updates_topic(run), "checkpoints": checkpoints_topic(run),
             "groups": site_group(run, ""),
             "prompts": prompts_topic(run), "rollouts": rollouts_topic(run), "generate": generate_group(run)}
    return [ACL(principal=principal, host="*", operation=op, permission_type=ACLPermissionType.ALLOW,
                resource_pattern=ResourcePattern(kind, template.format(**names), pattern))
            for kind, template, pattern, ops in GRANTS[role] for op in ops]


def principal(user: str) -> str:
    """`User:NAME` for NAME (a principal given whole is kept)."""
    return user if ":" in user else f"User:{user}"


def _kafka(log):
    """The log's Kafka admin client; ConfigError for a log that has no ACLs (the embedded file log)."""
    if not hasattr(log, "admin"):
        raise ConfigError(f"--log {log.url}: ACLs are Kafka's; the embedded file log has none (one machine, file "
                          f"permissions)")
    return log.admin


def grant(log, run: str, users: dict) -> int:
    """Create the ACLs of `users` ({role: user}) for `run` on a Kafka log; returns how many; LogError on a refusal."""
    acls = [a for role, user in users.items() for a in acls_for(run, role, principal(user))]
    result = _kafka(log).create_acls(acls)
    if result["failed"]:
        acl, err = result["failed"][0]
        why = type(err).__name__ if not isinstance(err, type) else err.__name__
        raise LogError(f"{log.url}: creating ACL {acl.operation.name} on {acl.resource_pattern.resource_type.name} "
                       f"{acl.resource_pattern.resource_name!r} for {acl.principal} failed: {why} "
                       f"(--kafka-config must name a super user or a principal with ALTER on the cluster)")
    return len(acls)


def show(log, run: str) -> list:
    """Rows (principal, operation, resource type, name, pattern) of the cluster's ACLs that match this run's
    resources."""
    rows = []
    for kind, name in ((Res.TOPIC, updates_topic(run)), (Res.TOPIC, checkpoints_topic(run)),
                       (Res.GROUP, site_group(run, "x")), (Res.TRANSACTIONAL_ID, f"hilo.{run}")):
        flt = ACLFilter(principal=None, host="*", operation=Op.ANY, permission_type=ACLPermissionType.ANY,
                        resource_pattern=ResourcePatternFilter(kind, name, Pattern.MATCH))
        acls, err = _kafka(log).describe_acls(flt)
        if getattr(err, "errno", 0):
            raise LogError(f"{log.url}: listing ACLs failed: "
                           f"{err.__name__ if isinstance(err, type) else type(err).__name__}")
        rows += [{"principal": a.principal, "operation": a.operation.name,
                  "resource": a.resource_pattern.resource_type.name,
                  "name": a.resource_pattern.resource_name, "pattern": a.resource_pattern.pattern_type.name}
                 for a in acls]
    return sorted({tuple(r.items()): r for r in rows}.values(),
                  key=lambda r: (r["principal"], r["resource"], r["name"], r["operation"]))
