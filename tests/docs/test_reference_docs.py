"""The documents against the code: every setting, metric, command, exit code and Helm value they name.

The tables of docs/reference.md are the code's own:
`.venv/bin/python -m tests.docs.test_reference_docs` prints their rows from `pipeline/settings.py`
and `pipeline/capabilities/config.py`, and the tests fail when a row is missing, differs or names
a setting that does not exist. The command table and exit codes are in docs/usage.md; the README
keeps the two set-up commands; every relative link of the README and docs/ leads to a file that
exists.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from pipeline.capabilities.config import ENV_PREFIX as HOST_PREFIX
from pipeline.capabilities.config import HostConfig
from pipeline.settings import ENV_PREFIX, REPO_ROOT, Settings
from tests.support.monitoring import exported_metrics

README = (REPO_ROOT / "README.md").read_text()
DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))
REFERENCE = (REPO_ROOT / "docs" / "reference.md").read_text().splitlines()
USAGE = (REPO_ROOT / "docs" / "usage.md").read_text().splitlines()
EVERYTHING = README + "".join(path.read_text() for path in DOCS)


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, Path):
        value = value.relative_to(REPO_ROOT) if value.is_relative_to(REPO_ROOT) else value
    if isinstance(value, dict):
        value = json.dumps(value)
    if isinstance(value, bool):
        value = str(value).lower()
    return f"`{value}`" if str(value) else '`""`'


def config_rows(model: type[BaseModel], prefix: str) -> list[str]:
    """One reference table row per field: variable, default, description."""
    rows = []
    for name, field in model.model_fields.items():
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name.upper()}` | {_default(field.default)} | {description} |")
    return rows


def _table_rows(marker: str) -> list[str]:
    return [line for line in REFERENCE if line.startswith(marker)]


def test_every_setting_has_its_row() -> None:
    expected = config_rows(Settings, ENV_PREFIX) + config_rows(HostConfig, HOST_PREFIX)
    missing = [row for row in expected if row not in REFERENCE]
    assert not missing, (
        "reference rows missing or out of date (print them: python -m tests.docs.test_reference_docs):\n"
        + ("\n".join(missing))
    )


def test_no_row_names_a_setting_that_does_not_exist() -> None:
    known = {row.split(" | ")[0] for row in config_rows(Settings, ENV_PREFIX) + config_rows(HostConfig, HOST_PREFIX)}
    scripts = "\n".join(path.read_text() for path in (REPO_ROOT / "scripts").rglob("*.sh"))
    for row in _table_rows("| `AGENTSTREAM_"):
        name = row.split(" | ")[0]
        variable = name.removeprefix("| `").removesuffix("`")
        assert name in known or variable in scripts, f"docs/reference.md names an unknown setting: {row}"


def test_every_metric_has_its_row() -> None:
    metrics = exported_metrics()
    assert len(metrics) > 20
    rows = {row.split(" | ")[0].removeprefix("| `").removesuffix("`"): row for row in _table_rows("| `agentstream_")}
    for name, (kind, labels) in metrics.items():
        assert name in rows, f"docs/reference.md metrics table has no row for {name}"
        cells = [cell.strip() for cell in rows[name].split(" | ")]
        assert cells[1] == kind, rows[name]
        assert cells[2] == (", ".join(labels) or "-"), rows[name]
    stale = set(rows) - set(metrics)
    assert not stale, f"docs/reference.md lists metrics the code does not have: {sorted(stale)}"


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, argparse.ArgumentParser]]:
    subparsers = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not subparsers:
        return [(" ".join(path), parser)]
    return [leaf for name, sub in subparsers[0].choices.items() for leaf in _leaves(sub, (*path, name))]


def test_every_command_and_option_is_in_the_cli_table() -> None:
    from pipeline.cli import build_parser

    leaves = _leaves(build_parser())
    assert len(leaves) >= 14
    for command, parser in leaves:
        rows = [row for row in USAGE if row.startswith(f"| `agentstream {command}")]
        assert rows, f"docs/usage.md command table has no row for `agentstream {command}`"
        cell = rows[0].split(" | ")[0]
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings:
                assert action.option_strings[-1] in cell, f"{action.option_strings[-1]} missing from: {cell}"
            elif action.choices:
                assert all(choice in cell for choice in action.choices), f"{action.choices} missing from: {cell}"


def test_exit_codes() -> None:
    from pipeline import exit_codes

    for code in exit_codes.ALL:
        assert any(line.startswith(f"| {code} |") for line in USAGE), f"docs/usage.md exit code table has no {code}"


def test_helm_values_named_in_the_docs_exist() -> None:
    values = yaml.safe_load((REPO_ROOT / "helm" / "agentstream" / "values.yaml").read_text())
    # `gateway.enabled`, `--set journal.replicas=N`; not file names such as `router.py`.
    named = set(re.findall(r"`((?:journal|caller|gateway|router|capabilities|kafka|topics)\.[A-Za-z.]+)`", EVERYTHING))
    named |= set(re.findall(r"--set ([A-Za-z.]+)=", EVERYTHING))
    named = {path for path in named if path.rsplit(".", 1)[-1] not in ("py", "md", "yaml", "sh")}
    assert "journal.replicas" in named
    for path in named:
        node: Any = values
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, f"the docs name Helm value {path}, values.yaml has none"
            node = node[part]


def test_set_up_commands_exist() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "make demo" in README and "make test" in README
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_dlq_reason_labels_are_all_in_the_metrics_table() -> None:
    """Finding: the metric table missed `misrouted` (and the labels being added)."""
    from pipeline.metrics import DLQ_REASON_LABELS, dlq_reason_label

    samples = {
        "not an append command: streamPath: missing": "not_a_command",
        "idempotency key 'k' already names a different event at @3": "idempotency_conflict",
        "record key b'x' is not the streamPath '/a'": "misrouted",
        "/a belongs to partition 1, not 0: key appends by stream path": "misrouted",
        "too_large: the command is 2000000 bytes, over maxEventBytes (921600)": "too_large",
        "forbidden: events.iterate.com/llm-request/requested is written by the workers": "forbidden",
        "internal_error: KeyError: 'x'": "internal_error",
        "payload.role: Input should be 'user'": "invalid_payload",
    }
    assert {reason: dlq_reason_label(reason) for reason in samples} == samples
    assert set(samples.values()) == set(DLQ_REASON_LABELS)
    (row,) = [line for line in REFERENCE if line.startswith("| `agentstream_dlq_records_total`")]
    assert all(f"`{label}`" in row for label in DLQ_REASON_LABELS), row


def test_every_relative_link_leads_to_a_file() -> None:
    for document in [REPO_ROOT / "README.md", *DOCS]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", document.read_text()):
            assert (document.parent / target).exists(), f"{document.name} links to {target}, which does not exist"


def test_the_readme_stays_short() -> None:
    """What it is, the two commands, one example, the picture and links; reference lives in docs/."""
    assert len(README.splitlines()) <= 160


if __name__ == "__main__":
    print("| variable | default | meaning |\n|---|---|---|")
    print("\n".join(config_rows(Settings, ENV_PREFIX)))
    print("\n| variable | default | meaning |\n|---|---|---|")
    print("\n".join(config_rows(HostConfig, HOST_PREFIX)))
    print()
    for name, (kind, labels) in exported_metrics().items():
        print(f"| `{name}` | {kind} | {', '.join(labels) or '-'} |")
