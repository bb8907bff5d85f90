#!/usr/bin/env bash
# Build and push the kvtrace image, then the Flex Template spec that points at it.
#   PROJECT=my-project REGION=europe-west4 BUCKET=my-bucket deploy/dataflow/build.sh
set -euo pipefail
: "${PROJECT:?set PROJECT}" "${REGION:?set REGION}" "${BUCKET:?set BUCKET}"
TAG="${TAG:-$(git rev-parse --short HEAD)}"
TOKENIZER="${TOKENIZER:-deepseek-ai/DeepSeek-R1}"
IMAGE="${REGION}-docker.pkg.dev/${PROJECT}/kvtrace/kvtrace:${TAG}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"

docker build -f "${ROOT}/deploy/docker/Dockerfile" --build-arg "TOKENIZER=${TOKENIZER}" \
    -t "${IMAGE}" "${ROOT}"
docker push "${IMAGE}"

gcloud dataflow flex-template build "gs://${BUCKET}/templates/kvtrace-anonymize.json" \
    --project "${PROJECT}" \
    --image "${IMAGE}" \
    --sdk-language PYTHON \
    --metadata-file "${ROOT}/deploy/dataflow/metadata.json"
echo "template: gs://${BUCKET}/templates/kvtrace-anonymize.json (image ${IMAGE})"
