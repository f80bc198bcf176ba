"""The `agentstream` command line: one entry point, `--help` on every command.

Exit codes: 0 success, 1 a check found differences, 2 bad input or configuration, 3 Kafka
unreachable or misconfigured, 4 no such stream or request, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException

from pipeline import agent_command, demo, fold_command, local_stack, replay
from pipeline.settings import Settings, SettingsError

EXIT_USAGE = 2
EXIT_KAFKA = 3


def _worker(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.kind == "journal":
        from pipeline.journal_worker import run
    else:
        from pipeline.llm_caller import run
    run(settings)
    return 0


def _topics_ensure(args: argparse.Namespace) -> int:
    from topics.admin import TopicMismatchError, ensure_topics
    from topics.names import topic_specs

    settings = Settings.from_env()
    specs = topic_specs(settings.topic_prefix, settings.partitions, settings.replication_factor)
    try:
        created = ensure_topics(settings.bootstrap_servers, specs, client_config=settings.kafka_client_config())
    except TopicMismatchError as error:
        print(f"agentstream topics ensure: {error}", file=sys.stderr)
        return EXIT_KAFKA
    for spec in specs:
        print(f"{spec.name}: {'created' if spec.name in created else 'ok'} ({spec.partitions} partitions)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentstream",
        description="Durable, replayable LLM agent memory on Apache Kafka. "
        "Settings come from AGENTSTREAM_* environment variables (see README).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fold_command.register(commands)
    replay.register(commands)
    demo.register(commands)
    local_stack.register(commands)
    agent_command.register(commands)

    worker = commands.add_parser("worker", help="run a worker in the foreground")
    worker.add_argument(
        "kind",
        choices=["journal", "caller"],
        help="journal: the journal processor (Faust); caller: answers llm-requests through the OpenAI SDK",
    )
    worker.set_defaults(run=_worker)

    topics = commands.add_parser("topics", help="create and verify the topic set")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    ensure = topic_commands.add_parser("ensure", help="create missing topics; verify existing ones")
    ensure.set_defaults(run=_topics_ensure)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Any = args.run
    try:
        return int(run(args))
    except SettingsError as error:
        print(f"agentstream: {error}", file=sys.stderr)
        return EXIT_USAGE
    except LookupError as error:
        print(f"agentstream: {error}", file=sys.stderr)
        return agent_command.EXIT_NOT_FOUND
    except agent_command.ERRORS as error:
        print(f"agentstream: {error}", file=sys.stderr)
        return EXIT_USAGE
    except local_stack.StackError as error:
        print(f"agentstream: {error}", file=sys.stderr)
        return EXIT_KAFKA
    except KafkaException as error:
        print(f"agentstream: Kafka error: {error.args[0].str() if error.args else error}", file=sys.stderr)
        return EXIT_KAFKA
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
