#!/usr/bin/env bash
# Start one night's export from the Flex Template (build.sh made it).
#   PROJECT=my-project REGION=europe-west4 BUCKET=my-bucket IMAGE=... deploy/dataflow/run.sh 2026-11-20
set -euo pipefail
: "${PROJECT:?set PROJECT}" "${REGION:?set REGION}" "${BUCKET:?set BUCKET}" "${IMAGE:?set IMAGE}"
DATE="${1:?usage: run.sh YYYY-MM-DD}"
CONFIGS="${CONFIGS:-configs/deepseek-r1.yaml,configs/dataflow.yaml}"

gcloud dataflow flex-template run "kvtrace-${DATE}" \
    --project "${PROJECT}" \
    --region "${REGION}" \
    --template-file-gcs-location "gs://${BUCKET}/templates/kvtrace-anonymize.json" \
    --parameters "^~^date=${DATE}~config=${CONFIGS}~sdk_container_image=${IMAGE}~sdk_location=container"
