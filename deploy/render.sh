#!/usr/bin/env bash
# Fill deploy/'s Kubernetes manifests and the presets of configs/ with a site's values (a copy of
# deploy/values.env) and write them to OUT: OUT/{flink,schedule,kafka}/, ready for
# `kubectl apply -f OUT/...`, and OUT/configs/, the presets to pass to --config (Dataflow's
# dataflow.yaml filled in, the others as they are, so that one folder holds a night's presets).
# Only the names values.env declares are replaced (a shell's $(...) in a manifest stays as it
# is); an empty value is an error.
#   deploy/render.sh site.env rendered/
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
values="${1:?usage: render.sh VALUES_FILE OUT_DIR}"
out="${2:?usage: render.sh VALUES_FILE OUT_DIR}"
command -v envsubst >/dev/null || { echo "render.sh: envsubst not found (gettext)" >&2; exit 1; }
names=$(sed -n 's/^\(KVTRACE_[A-Z_]*\)=.*/\1/p' "$here/values.env")
set -a
# shellcheck source=values.env
source "$values"
set +a
shell_format=""
for name in $names; do
  [ -n "${!name:-}" ] || { echo "render.sh: $name is empty in $values" >&2; exit 1; }
  shell_format+="\${$name}"
done
for manifest in flink/rbac.yaml flink/flink-session.yaml schedule/cronjob.yaml kafka/streaming.yaml; do
  mkdir -p "$out/$(dirname "$manifest")"
  envsubst "$shell_format" <"$here/$manifest" >"$out/$manifest"
done
mkdir -p "$out/configs"
for preset in "$here"/../configs/*.yaml; do
  envsubst "$shell_format" <"$preset" >"$out/configs/$(basename "$preset")"
done
echo "render.sh: wrote $out/{flink,schedule,kafka}/ and $out/configs/ from $values"
