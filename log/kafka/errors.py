"""kafka-python's errors, classified by their types and `retriable` flag, and said in one line."""
import kafka.errors as K

from hilo.schemas.errors import LogError, LogUnavailable

_RESOURCES = {K.TopicAuthorizationFailedError: "topic", K.ClusterAuthorizationFailedError: "cluster",
              K.GroupAuthorizationFailedError: "consumer group",
              K.TransactionalIdAuthorizationFailedError: "transactional id"}
_FENCED = (K.ProducerFencedError, K.InvalidProducerEpochError)


def unwrap(e: Exception) -> Exception:
    """The error kafka-python means. Workaround: its TransactionManager reports a fatal error as a plain
    KafkaError("Cannot execute transactional method because we are in an error state: ProducerFencedError...")
    (transaction_manager.py `_fail_if_in_error_state`), losing the type; the type named in that message is restored.
    Shown by tests/log/test_kafka_errors.py::test_a_zombie_producers_wrapped_error_is_fenced."""
    if type(e) is not K.KafkaError:
        return e
    for arg in e.args:
        if isinstance(arg, K.KafkaError):
            return arg
    for word in str(e).replace(":", " ").replace("(", " ").split():
        cls = getattr(K, word.strip(",.'\""), None)
        if isinstance(cls, type) and issubclass(cls, K.KafkaError) and cls is not K.KafkaError:
            return cls(str(e))
    return e


def is_fenced(e: Exception) -> bool:
    """A newer producer of the same transactional id took over."""
    return isinstance(unwrap(e), _FENCED)


def is_retriable(e: Exception) -> bool:
    """kafka-python says the same request may succeed later (a leader election, a coordinator loading)."""
    return isinstance(e, K.KafkaError) and bool(getattr(unwrap(e), "retriable", False))


def from_code(code: int) -> K.KafkaError:
    """The error a response's error code stands for."""
    return K.for_code(code)()


def failure(what: str, e: Exception) -> LogError:
    """One line for a failed request; an ACL refusal says so without kafka-python's request dump."""
    e = unwrap(e)
    if isinstance(e, K.AuthorizationError):
        resource = next((r for cls, r in _RESOURCES.items() if isinstance(e, cls)), "resource")
        return LogError(f"{what}: the broker refused it: this principal is not authorised on the {resource} "
                        f"({type(e).__name__}); an operator grants a run's ACLs with `hilo acls grant`")
    # a retriable error that outlived its retries (a timeout, no leader) is an outage: worth waiting out, not a verdict
    return (LogUnavailable if is_retriable(e) else LogError)(f"{what}: {type(e).__name__}: {e}")
