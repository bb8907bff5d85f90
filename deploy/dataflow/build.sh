#!/usr/bin/env bash
# Build and push the kvtrace image holding the site's rendered presets, then the Flex Template
# spec that points at it. Every value comes from the site's copy of deploy/values.env: the image
# is KVTRACE_IMAGE (e.g. REGION-docker.pkg.dev/PROJECT/kvtrace/kvtrace:TAG), the spec goes to
# gs://KVTRACE_BUCKET/templates/ in KVTRACE_GCP_PROJECT. TOKENIZER: the hub tokenizer to pre-fetch.
#   deploy/dataflow/build.sh site.env
set -euo pipefail
values="${1:?usage: build.sh VALUES_FILE}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TOKENIZER="${TOKENIZER:-deepseek-ai/DeepSeek-R1}"

# The presets the image holds, rendered from the same values (render.sh refuses an empty one),
# into a folder inside the build context that goes when the build does.
rendered="$(mktemp -d "${ROOT}/.dataflow-build.XXXXXX")"
trap 'rm -rf "${rendered}"' EXIT
"${ROOT}/deploy/render.sh" "${values}" "${rendered}" >/dev/null
set -a
# shellcheck source=../values.env
source "${values}"
set +a

docker build -f "${ROOT}/deploy/docker/Dockerfile" --build-arg "TOKENIZER=${TOKENIZER}" \
    --build-arg "CONFIGS=${rendered#"${ROOT}/"}/configs" -t "${KVTRACE_IMAGE}" "${ROOT}"
docker push "${KVTRACE_IMAGE}"

gcloud dataflow flex-template build "gs://${KVTRACE_BUCKET}/templates/kvtrace-anonymize.json" \
    --project "${KVTRACE_GCP_PROJECT}" \
    --image "${KVTRACE_IMAGE}" \
    --sdk-language PYTHON \
    --metadata-file "${ROOT}/deploy/dataflow/metadata.json"
echo "template: gs://${KVTRACE_BUCKET}/templates/kvtrace-anonymize.json (image ${KVTRACE_IMAGE})"
