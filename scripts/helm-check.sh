#!/usr/bin/env bash
# Lints and renders the Helm chart offline (no cluster needed): `helm lint --strict`, `helm template`
# and a client-side `helm install --dry-run` (which also renders NOTES.txt), with the default values
# and with everything on (TLS, SASL, the OpenAI key Secret, the ServiceMonitor:
# helm/agentstream/ci/*-values.yaml); then checks that replicas beyond the partition count are
# refused. Fails on the first error. helm comes from scripts/helm.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

HELM="$(scripts/helm.sh)"
# helm lint/template write nothing, but keep helm's state away from $HOME (and out of the working
# directory when HOME is unset, where helm v4 falls back to relative paths such as .cache/helm).
export HELM_CACHE_HOME="$ROOT/.local/helm/home/cache"
export HELM_CONFIG_HOME="$ROOT/.local/helm/home/config"
export HELM_DATA_HOME="$ROOT/.local/helm/home/data"

CHART=helm/agentstream
echo "==> $("$HELM" version --short)"

value_sets=("")
for file in "$CHART"/ci/*-values.yaml; do
  [[ -e $file ]] && value_sets+=("$file")
done

for values in "${value_sets[@]}"; do
  args=()
  [[ -n $values ]] && args=(-f "$values")
  label="${values:-default values}"
  echo "==> helm lint --strict ($label)"
  "$HELM" lint --strict "$CHART" "${args[@]}"
  echo "==> helm template ($label)"
  out="$("$HELM" template agentstream "$CHART" --namespace agentstream "${args[@]}")"
  echo "    $(grep -c '^kind:' <<<"$out") objects"
  echo "==> helm install --dry-run=client ($label: NOTES.txt too)"
  out="$("$HELM" install agentstream "$CHART" --namespace agentstream --dry-run=client "${args[@]}")"
  [[ "${out#*$'\n'NOTES:$'\n'}" != "$out" ]] || { echo "helm-check.sh: NOTES.txt did not render" >&2; exit 1; }
done

echo "==> helm template refuses journal.replicas > kafka.partitions"
if err="$("$HELM" template agentstream "$CHART" --set kafka.partitions=2 --set journal.replicas=3 2>&1)"; then
  echo "helm-check.sh: journal.replicas=3 with kafka.partitions=2 rendered; it must fail" >&2
  exit 1
fi
grep -q "bounded by the partition count" <<<"$err" || { echo "$err" >&2; exit 1; }

echo "helm-check.sh: ok"
