"""The `agentstream` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pipeline import fold_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentstream", description="Durable, replayable LLM agent memory on Apache Kafka."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fold_command.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
