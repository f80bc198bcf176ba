"""`agentstream replay`: the command line of `pipeline.journal.replay` (rebuild, then verify)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from pipeline import exit_codes
from pipeline.cli.agent_verb import check_path
from pipeline.journal import replay as replaying
from pipeline.journal.replay import ReplayInterrupted, replay
from pipeline.journal.replay_store import default_out_dir, live_store_paths, prepare_out_dir
from pipeline.journal.replay_verify import verify
from pipeline.settings import Settings
from topics.admin import require_topics
from topics.names import topic_names


def register(verbs: Any) -> None:
    parser = verbs.add_parser(
        "replay",
        help="rebuild projections from agent-journal into a fresh store (and verify the live one)",
        description=replaying.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--path", help="replay one stream only (default: all streams)")
    parser.add_argument(
        "--out",
        type=Path,
        help="directory for the rebuilt rows: new, empty or an earlier replay's output, outside the live data "
        "directory (default: <data dir>-replay beside it)",
    )
    parser.add_argument(
        "--verify", action="store_true", help="compare every row with the live store; exit 1 if any differ"
    )
    parser.add_argument(
        "--jobs",
        type=_positive,
        default=1,
        metavar="N",
        help="replay partitions in N processes at once (default 1; more than the partition count is no faster)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes, at least 1 (got {text!r})")
    return value


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.path is not None:
        check_path(args.path)
    out_dir = args.out or default_out_dir(settings)
    prepare_out_dir(out_dir, settings.data_dir)  # refuse before reading the journal
    names = topic_names(settings.topic_prefix)
    require_topics(
        settings.bootstrap_servers, [names.journal], settings.partitions, client_config=settings.kafka_client_config()
    )
    try:
        stats = replay(settings, out_dir, args.path, progress=not args.quiet, jobs=args.jobs)
    except ReplayInterrupted as stop:  # no summary, no verify: the output is not a replay
        print(f"agentstream: {stop}: {out_dir} is incomplete (the next replay into it starts over)", file=sys.stderr)
        return exit_codes.TERMINATED if stop.signum == signal.SIGTERM else exit_codes.INTERRUPTED
    if args.path is not None and args.path not in stats.streams:
        raise LookupError(
            f"no events of {args.path} in {names.journal}: check the path (agentstream agent create prints it)"
        )
    rate = stats.events / stats.seconds if stats.seconds else 0.0
    print(
        f"replayed {stats.events} events of {len(stats.streams)} streams in {stats.seconds:.2f}s "
        f"({rate:,.0f} events/s) into {out_dir}"
    )
    if not args.verify:
        return 0
    differences = verify(out_dir, live_store_paths(settings), args.path)
    if differences:
        streams = {d.stream for d in differences if d.stream is not None}
        print(f"{len(differences)} row(s) differ from the live store ({len(streams)} stream(s) affected):")
        for difference in differences:
            print(f"  {difference}")
        return exit_codes.DIFFERENT
    print("live store matches the journal")
    return 0
