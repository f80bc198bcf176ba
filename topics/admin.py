"""Create and verify the topic set with confluent-kafka's AdminClient."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from topics.names import TopicSpec

# librdkafka's own log lines (e.g. one `FAIL` per connection attempt: hundreds while a bootstrap
# server is wrong) go here instead of stderr. The NullHandler keeps them quiet in the CLI, whose
# error is one line of its own; a worker that configures logging sees them with its other logs.
KAFKA_LOG = logging.getLogger("agentstream.kafka")
KAFKA_LOG.addHandler(logging.NullHandler())


def quiet_librdkafka(config: Mapping[str, Any]) -> dict[str, Any]:
    """A confluent-kafka config whose librdkafka logs (errors only) go to `KAFKA_LOG`, not stderr."""
    return {"log_level": 3, **config, "logger": KAFKA_LOG}


class KafkaSetupError(RuntimeError):
    """Kafka cannot be reached, or the topic set is missing or does not match the settings."""


class TopicMismatchError(KafkaSetupError):
    """An existing topic does not have the partitions or configs agentstream needs."""


def admin_client(bootstrap: str, client_config: Mapping[str, str] | None = None) -> AdminClient:
    return AdminClient(quiet_librdkafka({"bootstrap.servers": bootstrap, **(client_config or {})}))


def require_topics(
    bootstrap: str,
    names: Sequence[str],
    partitions: int,
    *,
    client_config: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> None:
    """Check that Kafka answers and that every topic in `names` exists with `partitions` partitions.

    Raises `KafkaSetupError` with one line saying what to fix (a command then exits 3 at once
    instead of failing later with a less telling error).
    """
    admin = admin_client(bootstrap, client_config)
    try:
        topics = admin.list_topics(timeout=timeout).topics
    except KafkaException as error:
        reason = error.args[0].str() if error.args else str(error)
        raise KafkaSetupError(
            f"cannot reach Kafka at {bootstrap} within {timeout:g}s ({reason}); "
            "check AGENTSTREAM_BOOTSTRAP_SERVERS and that the broker runs"
        ) from None
    missing = [name for name in names if name not in topics or topics[name].error is not None]
    if missing:
        raise KafkaSetupError(
            f"topic{'s' if len(missing) > 1 else ''} {', '.join(missing)} not found at {bootstrap}; "
            "run `agentstream topics ensure` (or check AGENTSTREAM_TOPIC_PREFIX)"
        )
    for name in names:
        actual = len(topics[name].partitions)
        if actual != partitions:
            raise TopicMismatchError(
                f"topic {name} has {actual} partitions but AGENTSTREAM_PARTITIONS is {partitions}; "
                "set it to the topics' partition count"
            )


def ensure_topics(
    bootstrap: str,
    specs: Sequence[TopicSpec],
    *,
    client_config: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> list[str]:
    """Create the missing topics; verify partitions and configs of the existing ones.

    Returns the names created. Raises `TopicMismatchError` naming topic, setting, expected and actual.
    """
    admin = admin_client(bootstrap, client_config)
    reach = min(timeout, 10.0)  # a broker that answers at all answers metadata at once
    try:
        existing = admin.list_topics(timeout=reach).topics
    except KafkaException as error:
        reason = error.args[0].str() if error.args else str(error)
        raise KafkaSetupError(
            f"cannot reach Kafka at {bootstrap} within {reach:g}s ({reason}); "
            "check AGENTSTREAM_BOOTSTRAP_SERVERS and that the broker runs"
        ) from None
    missing = [spec for spec in specs if spec.name not in existing]
    created: list[str] = []
    if missing:
        futures = admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, config=dict(s.configs)) for s in missing],
            operation_timeout=timeout,
        )
        for name, future in futures.items():
            try:
                future.result()
                created.append(name)
            except KafkaException as error:
                if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent ensure won
                    raise TopicMismatchError(f"cannot create topic {name}: {error}") from None
    if created:
        _wait_for_leaders(admin, created, timeout)
    problems = _verify(admin, [s for s in specs if s.name not in created], timeout)
    if problems:
        raise TopicMismatchError(
            "existing topics do not match what agentstream needs:\n  "
            + "\n  ".join(problems)
            + "\nFix them (kafka-configs / kafka-topics --alter) or choose another AGENTSTREAM_TOPIC_PREFIX."
        )
    return created


def _wait_for_leaders(admin: AdminClient, names: Sequence[str], timeout: float) -> None:
    """A new topic answers NOT_LEADER until its partitions have leaders; wait for that."""
    deadline = time.monotonic() + timeout
    while True:
        topics = admin.list_topics(timeout=timeout).topics
        if all(
            name in topics and topics[name].partitions and all(p.leader >= 0 for p in topics[name].partitions.values())
            for name in names
        ):
            return
        if time.monotonic() > deadline:
            raise TopicMismatchError(f"created topics {list(names)} have no partition leaders after {timeout:.0f}s")
        time.sleep(0.1)


def _verify(admin: AdminClient, specs: Sequence[TopicSpec], timeout: float) -> list[str]:
    if not specs:
        return []
    problems: list[str] = []
    metadata = admin.list_topics(timeout=timeout).topics
    for spec in specs:
        if spec.name not in metadata:
            problems.append(f"{spec.name}: missing (it was neither found nor created)")
            continue
        actual = len(metadata[spec.name].partitions)
        if actual != spec.partitions:
            problems.append(f"{spec.name}: partitions expected {spec.partitions}, actual {actual}")
        # Fewer replicas than asked for would lose the journal with one broker.
        replicas = min((len(p.replicas) for p in metadata[spec.name].partitions.values()), default=0)
        if replicas != spec.replication_factor:
            problems.append(f"{spec.name}: replication factor expected {spec.replication_factor}, actual {replicas}")
    specs = [spec for spec in specs if spec.name in metadata and spec.configs]
    if not specs:
        return problems
    # Look results up by resource: the returned dict is keyed by ConfigResource, not ordered by spec.
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, s.name) for s in specs])
    by_name = {resource.name: future for resource, future in futures.items()}
    for spec in specs:
        configs = by_name[spec.name].result(timeout=timeout)
        for key, expected in spec.configs.items():
            entry = configs.get(key)
            actual_value = None if entry is None else entry.value
            if actual_value != expected:
                problems.append(f"{spec.name}: {key} expected {expected}, actual {actual_value}")
    return problems


def delete_topics(bootstrap: str, names: Sequence[str], timeout: float = 30.0) -> None:
    admin = admin_client(bootstrap)
    for future in admin.delete_topics(list(names), operation_timeout=timeout).values():
        try:
            future.result()
        except KafkaException as error:
            if error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:  # already gone
                raise
