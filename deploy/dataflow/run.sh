#!/usr/bin/env bash
# Start one night's export from the Flex Template build.sh made, with the same site's values
# (deploy/values.env's names: KVTRACE_GCP_PROJECT, KVTRACE_GCP_REGION, KVTRACE_BUCKET,
# KVTRACE_IMAGE). CONFIGS: the presets inside the image, rendered by build.sh.
#   deploy/dataflow/run.sh site.env 2026-11-20
set -euo pipefail
values="${1:?usage: run.sh VALUES_FILE YYYY-MM-DD}"
DATE="${2:?usage: run.sh VALUES_FILE YYYY-MM-DD}"
set -a
# shellcheck source=../values.env
source "${values}"
set +a
for name in KVTRACE_GCP_PROJECT KVTRACE_GCP_REGION KVTRACE_BUCKET KVTRACE_IMAGE; do
  [ -n "${!name:-}" ] || { echo "run.sh: ${name} is empty in ${values}" >&2; exit 1; }
done
CONFIGS="${CONFIGS:-configs/deepseek-r1.yaml,configs/dataflow.yaml}"

gcloud dataflow flex-template run "kvtrace-${DATE}" \
    --project "${KVTRACE_GCP_PROJECT}" \
    --region "${KVTRACE_GCP_REGION}" \
    --template-file-gcs-location "gs://${KVTRACE_BUCKET}/templates/kvtrace-anonymize.json" \
    --parameters "^~^date=${DATE}~config=${CONFIGS}~sdk_container_image=${KVTRACE_IMAGE}~sdk_location=container"
