"""The `agentstream` command line: one entry point, `--help` on every verb.

Exit codes: 0 success, 1 a check found differences (`replay --verify`; the demo's turn did not
succeed), 2 bad input or configuration, 3 Kafka unreachable or misconfigured (missing topics, a
failed delivery, no outcome from the journal worker within the timeout), 4 no such stream or
request, 130 interrupted, 143 `replay` stopped by SIGTERM (pipeline/exit_codes.py). Errors are one
line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException
from pydantic import ValidationError

from pipeline import exit_codes, tracing
from pipeline.cli import agent_verb, fold_verb, replay_verb
from pipeline.client import AppendError, AppendRejected
from pipeline.dev import demo, local_stack
from pipeline.gateway import cli as gateway_cli
from pipeline.gateway.mcp import stdio as mcp_stdio
from pipeline.settings import Settings, SettingsError
from pipeline.terminal import escape_controls
from topics.admin import KafkaSetupError

# The CLI's names of the exit codes (pipeline/exit_codes.py defines every one).
EXIT_DIFFERENT = exit_codes.DIFFERENT
EXIT_USAGE = exit_codes.USAGE
EXIT_KAFKA = exit_codes.KAFKA
EXIT_NOT_FOUND = exit_codes.NOT_FOUND
EXIT_INTERRUPTED = exit_codes.INTERRUPTED


def _worker(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    tracing.configure(args.kind)  # only with OTEL_* set (docs/behaviour.md §8)
    if args.kind == "journal":
        from pipeline.journal.worker import run
    elif args.kind == "router":
        from pipeline.router import run
    elif args.kind == "capabilities":
        from pipeline.capabilities.host import run
    else:
        from pipeline.caller import run
    run(settings)
    return 0


def _topics_ensure(args: argparse.Namespace) -> int:
    from topics.admin import ensure_topics
    from topics.names import journal_worker_topic_specs, topic_specs

    settings = Settings.from_env()
    specs = topic_specs(settings.topic_prefix, settings.partitions, settings.replication_factor)
    specs += journal_worker_topic_specs(settings.app_id, settings.partitions, settings.replication_factor)
    try:
        created = ensure_topics(settings.bootstrap_servers, specs, client_config=settings.kafka_client_config())
    except KafkaSetupError as error:  # the list of mismatches stays one line per topic
        print(f"agentstream topics ensure: {error}", file=sys.stderr)
        return EXIT_KAFKA
    for spec in specs:
        print(f"{spec.name}: {'created' if spec.name in created else 'ok'} ({spec.partitions} partitions)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentstream",
        description="Durable, replayable LLM agent memory on Apache Kafka. "
        "Settings come from AGENTSTREAM_* environment variables (see docs/reference.md).",
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    fold_verb.register(verbs)
    replay_verb.register(verbs)
    demo.register(verbs)
    local_stack.register(verbs)
    agent_verb.register(verbs)
    gateway_cli.register(verbs)
    mcp_stdio.register(verbs)

    worker = verbs.add_parser("worker", help="run a worker in the foreground")
    worker.add_argument(
        "kind",
        choices=["journal", "caller", "router", "capabilities"],
        help="journal: the journal processor (Faust); caller: answers llm-requests through the OpenAI SDK; "
        "router: routes events of subscribed streams to their subscribers (Faust); "
        "capabilities: runs the Python agents write, sandboxed (pydantic-monty)",
    )
    worker.set_defaults(run=_worker)

    topics = verbs.add_parser("topics", help="create and verify the topic set")
    topic_verbs = topics.add_subparsers(dest="topics_verb", required=True, metavar="ACTION")
    ensure = topic_verbs.add_parser("ensure", help="create missing topics; verify existing ones")
    ensure.set_defaults(run=_topics_ensure)
    return parser


def one_line(error: BaseException | str) -> str:
    """An error as one line: pydantic's multi-line report (with its URLs) folded into `field: problem; ...`.

    Control characters are written visibly: a rejection reason may quote what an append carried.
    """
    if isinstance(error, ValidationError):
        return escape_controls(
            "; ".join(
                f"{'.'.join(str(part) for part in problem['loc']) or 'input'}: {problem['msg']}"
                for problem in error.errors(include_url=False)
            )
        )
    return escape_controls(" ".join(str(error).split()))


def _fail(error: BaseException | str, code: int, what: str = "") -> int:
    print(f"agentstream: {what}{one_line(error)}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Any = args.run
    try:
        return int(run(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except SystemError as error:
        # A Ctrl-C landing inside some C calls surfaces as a SystemError caused by the
        # KeyboardInterrupt (seen in `replay` under load): still an interruption, not a crash.
        if isinstance(error.__cause__, KeyboardInterrupt):
            return EXIT_INTERRUPTED
        raise
    except BrokenPipeError:
        return 0
    except SettingsError as error:
        return _fail(error, EXIT_USAGE)
    except LookupError as error:
        return _fail(error, EXIT_NOT_FOUND)
    except AppendRejected as error:  # the journal said no: the input is at fault
        return _fail(error, EXIT_USAGE)
    except (AppendError, KafkaSetupError, local_stack.StackError) as error:
        return _fail(error, EXIT_KAFKA)
    except KafkaException as error:
        return _fail(error.args[0].str() if error.args else error, EXIT_KAFKA, "Kafka error: ")
    except ValueError as error:  # pydantic's ValidationError included
        return _fail(error, EXIT_USAGE)


if __name__ == "__main__":
    sys.exit(main())
