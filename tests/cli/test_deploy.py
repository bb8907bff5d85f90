"""deploy/ and configs/ hold what users run in production: check they agree with the code."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from helpers import ROOT, chat, render_deploy, write_jsonl
from kvtrace.cli import _parser
from kvtrace.config import fill_dates, load_presets, parse_date

DEPLOY = ROOT / "deploy"


def anonymize_flags() -> set[str]:
    commands = next(a for a in _parser()._actions if a.dest == "command")
    return {o for a in commands.choices["anonymize"]._actions for o in a.option_strings}


def documents(path: Path) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text())}


def test_every_preset_parses_and_model_plus_environment_merge(tmp_path):
    flags = anonymize_flags()
    for preset in ROOT.glob("configs/*.yaml"):
        options, _ = load_presets([str(preset)])
        assert {f"--{k.replace('_', '-')}" for k in options} <= flags, preset.name
    presets = render_deploy(tmp_path / "out") / "configs"  # Dataflow's filled in
    for env in ("dataflow", "flink"):
        options, beam = load_presets(
            [str(presets / "deepseek-r1.yaml"), str(presets / f"{env}.yaml")]
        )
        filled = fill_dates(options, parse_date("2026-11-20"))
        assert "/2026-11-20" in filled["output"] and "2026-11-20" in filled["input"]
        assert filled["tokenizer"] == "deepseek-ai/DeepSeek-R1" and filled["id_map"]
        assert beam["runner"] in ("DataflowRunner", "PortableRunner")


@pytest.mark.beam
def test_dockerfile_matches_the_beam_version_and_the_sources():
    import apache_beam

    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert re.search(r"ARG BEAM_VERSION=(\S+)", text).group(1) == apache_beam.__version__
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.M))
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.M):
        for part in PLACEHOLDER.sub(lambda arg: defaults[arg[1]], source).split():
            assert (ROOT / part).exists(), part
    launcher_file = re.search(r"FLEX_TEMPLATE_PYTHON_PY_FILE=/opt/kvtrace/(\S+)", text).group(1)
    assert (ROOT / launcher_file).is_file()


def _sent_to_the_builder(path: str) -> bool:
    """Whether .dockerignore lets path into the build context: its last pattern matching the
    path or a folder above it decides (Docker's rule; these patterns need no more)."""
    sent = True
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        keep = pattern.startswith("!")
        pattern = pattern.removeprefix("!").removeprefix("**/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes + parts):
            sent = keep
    return sent


def test_the_build_context_holds_what_the_images_copy_and_nothing_private():
    for dockerfile in (DEPLOY / "docker").glob("Dockerfile*"):
        text = dockerfile.read_text()
        defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.M))
        for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.M):
            for part in PLACEHOLDER.sub(lambda arg: defaults[arg[1]], source).split():
                assert _sent_to_the_builder(f"{part}/x.py"), part
    assert _sent_to_the_builder(".dataflow-build.a1B2c3/configs/default.yaml")  # build.sh's
    for private in (
        "salt",
        "out/trace-00000-of-00001.jsonl",
        "logs/day.jsonl.gz",
        ".git/config",
        "id-map/versions/000001.json",
        "kvtrace/__pycache__/cli.cpython-311.pyc",
    ):
        assert not _sent_to_the_builder(private), private


def test_flex_template_parameters_are_kvtrace_flags_and_scripts_parse():
    metadata = json.loads((DEPLOY / "dataflow" / "metadata.json").read_text())
    names = {p["name"] for p in metadata["parameters"]}
    assert {"date", "config"} <= names
    assert {f"--{n.replace('_', '-')}" for n in names} <= anonymize_flags()
    for script in (DEPLOY / "dataflow").glob("*.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)
        assert os.access(script, os.X_OK), script


def test_flink_manifests_agree_with_the_flink_preset():
    manifests = documents(DEPLOY / "flink" / "flink-session.yaml")
    assert set(manifests) == {"FlinkDeployment", "Deployment", "Service"}
    _, beam = load_presets([str(ROOT / "configs/flink.yaml")])
    pool = next(
        c
        for c in manifests["FlinkDeployment"]["spec"]["taskManager"]["podTemplate"]["spec"][
            "containers"
        ]
        if c["name"] == "beam-worker-pool"
    )
    assert pool["args"] == ["--worker_pool"]
    assert beam["environment_config"] == f"localhost:{pool['ports'][0]['containerPort']}"
    service = manifests["Service"]
    ports = {p["port"] for p in service["spec"]["ports"]}
    for endpoint in (beam["job_endpoint"], beam["artifact_endpoint"]):
        host, port = endpoint.split(":")
        assert host == service["metadata"]["name"] and int(port) in ports
    versions = flink_versions()
    flink = manifests["FlinkDeployment"]["spec"]
    assert flink["image"] == f"flink:{versions['FLINK_VERSION']}"
    assert flink["flinkVersion"] == "v" + versions["FLINK_MINOR"].replace(".", "_")
    assert versions["FLINK_VERSION"].startswith(versions["FLINK_MINOR"] + ".")
    configuration = flink["flinkConfiguration"]
    assert configuration["restart-strategy.type"] == "fixed-delay"
    assert "execution.checkpointing.interval" in configuration
    assert durable_checkpoints(configuration, ("s3://", "gs://", "hdfs://"))
    job_server = manifests["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert job_server["image"] == "${KVTRACE_JOBSERVER_IMAGE}"
    heap, driver = job_server["args"][:2]
    assert driver == "org.apache.beam.runners.flink.FlinkJobServerDriver"
    # The heap bounded as the local cluster bounds it, inside the container's memory limit.
    assert heap == f"-Xmx{versions['JOB_SERVER_HEAP']}"
    assert mebibytes(heap[4:]) < mebibytes(job_server["resources"]["limits"]["memory"])


def mebibytes(size: str) -> int:
    """A JVM (512m) or Kubernetes (1Gi) memory size in MiB."""
    number, unit = re.fullmatch(r"(\d+)([mMgG])i?", size).groups()
    return int(number) * (1024 if unit in "gG" else 1)


def test_flink_runs_pair_beams_sdk_with_the_job_servers_release():
    """Beam supports a job server only with the SDK of its own release: whatever submits to the
    Flink cluster, or runs beside its TaskManagers, is the Flink image (the Dockerfile at
    versions.env's BEAM_VERSION), and the local cluster's Python installs that release."""
    versions = flink_versions()
    submitters = [
        c
        for name in ("flink/flink-session.yaml", "schedule/cronjob.yaml", "kafka/streaming.yaml")
        for document in yaml.safe_load_all((DEPLOY / name).read_text())
        for c in containers(document)
        if "kvtrace" in c["image"].lower() and "JOBSERVER" not in c["image"]
    ]
    assert len(submitters) == 3
    assert {c["image"] for c in submitters} == {"${KVTRACE_FLINK_IMAGE}"}
    values = (DEPLOY / "values.env").read_text()
    assert f"--build-arg BEAM_VERSION={versions['BEAM_VERSION']} " in values
    script = (DEPLOY / "flink" / "local-cluster.sh").read_text()
    assert 'print(f"apache-beam=={sys.argv[2]}")' in script
    assert '"$repo/pyproject.toml" "$BEAM_VERSION"' in script
    assert '-Xmx"$JOB_SERVER_HEAP"' in script


def containers(document: dict) -> list[dict]:
    """Every container a manifest's pods run (a CronJob's, a Deployment's, a FlinkDeployment's)."""
    found = []
    if isinstance(document, dict):
        if isinstance(document.get("containers"), list):
            found += [c for c in document["containers"] if "image" in c]
        for value in document.values():
            found += containers(value)
    elif isinstance(document, list):
        for value in document:
            found += containers(value)
    return found


# Flink 1.19's keys for the checkpoint store (its CheckpointingOptions); 1.20 renamed them
# (execution.checkpointing.dir, ...), and a key Flink does not know is ignored, silently.
CHECKPOINT_STORAGE, CHECKPOINTS_DIRECTORY = "state.checkpoint-storage", "state.checkpoints.dir"


def durable_checkpoints(configuration: dict[str, str], schemes: tuple[str, ...]) -> bool:
    """Checkpoints go to files under one of schemes, not to the JobManager's memory."""
    return (
        configuration.get(CHECKPOINT_STORAGE) == "filesystem"
        and configuration.get(CHECKPOINTS_DIRECTORY, "").startswith(schemes)
        and not any(key.startswith("execution.checkpointing.dir") for key in configuration)
    )


def flat(tree: dict, prefix: str = "") -> dict[str, str]:
    """Flink's YAML configuration as the dotted keys Flink reads."""
    keys: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            keys.update(flat(value, f"{prefix}{key}."))
        else:
            keys[f"{prefix}{key}"] = value
    return keys


def test_the_local_cluster_checkpoints_into_files_with_flink_119s_keys():
    script = (DEPLOY / "flink" / "local-cluster.sh").read_text()
    written = re.search(r'cat >"\$run/conf/config.yaml" <<EOF\n(.*?)\nEOF\n', script, re.S).group(1)
    configuration = flat(yaml.safe_load(written.replace("$run", "/run").replace("$", "")))
    assert durable_checkpoints(configuration, ("file:///run/",))
    assert configuration["execution.checkpointing.interval"]
    # The job server reads the same file: a job Beam builds takes its store from it too.
    assert '--flink-conf-dir="$run/conf"' in script


def test_taskmanagers_give_beams_data_plane_direct_memory():
    """Beam's gRPC data plane to the SDK workers allocates direct buffers, which Flink counts as
    task off-heap memory, 0 unless set: a job of 155 MB failed with "Direct buffer memory"."""
    script = (DEPLOY / "flink" / "local-cluster.sh").read_text()
    written = re.search(r'cat >"\$run/conf/config.yaml" <<EOF\n(.*?)\nEOF\n', script, re.S).group(1)
    local = flat(yaml.safe_load(written.replace("$run", "/run").replace("$", "")))
    manifests = documents(DEPLOY / "flink" / "flink-session.yaml")
    shipped = manifests["FlinkDeployment"]["spec"]["flinkConfiguration"]
    for configuration in (local, shipped):
        assert mebibytes(configuration["taskmanager.memory.task.off-heap.size"]) >= 512
        # each job loads Beam's classes anew: 256m (the default) ran out at the fifth job
        assert mebibytes(configuration["taskmanager.memory.jvm-metaspace.size"]) >= 512


def flink_versions() -> dict[str, str]:
    """deploy/flink/versions.env: the pins local-cluster.sh and the manifests share."""
    lines = (DEPLOY / "flink" / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_the_local_flink_cluster_resolves_the_pinned_job_server_and_its_script_parses():
    versions = flink_versions()
    pom = (DEPLOY / "flink" / "job-server" / "pom.xml").read_text()
    assert f"<artifactId>beam-runners-flink-{versions['FLINK_MINOR']}</artifactId>" in pom
    assert f"<version>{versions['BEAM_VERSION']}</version>" in pom
    # Every Beam artifact beside it (Kafka IO, expansion service) at the job server's release.
    beam_versions = re.findall(
        r"<groupId>org\.apache\.beam</groupId>\s*<artifactId>[^<]+</artifactId>\s*"
        r"<version>([^<]+)</version>",
        pom,
    )
    assert len(beam_versions) == 3 and set(beam_versions) == {versions["BEAM_VERSION"]}
    for other in (DEPLOY / "kafka" / "local-broker.sh", DEPLOY / "pubsub" / "emulator.sh"):
        subprocess.run(["bash", "-n", str(other)], check=True)
        assert os.access(other, os.X_OK)
    script = DEPLOY / "flink" / "local-cluster.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert os.access(script, os.X_OK)
    _, beam = load_presets([str(ROOT / "configs/flink-local.yaml")])
    assert beam["runner"] == "PortableRunner" and beam["job_endpoint"] == "localhost:8099"


def test_cronjob_runs_one_night_at_a_time_with_yesterdays_date():
    cronjob = documents(DEPLOY / "schedule" / "cronjob.yaml")["CronJob"]
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    container = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    command = " ".join(container["args"])
    assert '--date "$(date -u -d yesterday +%F)"' in command
    for preset in re.findall(r"--config (\S+)", command):
        assert (ROOT / preset).is_file(), preset


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_airflow_dag_imports_and_passes_the_previous_day(monkeypatch, tmp_path):
    pytest.importorskip("airflow.providers.apache.beam", reason="needs the deploy-test extra")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    spec = importlib.util.spec_from_file_location(
        "kvtrace_nightly_dag", DEPLOY / "schedule" / "kvtrace_nightly_dag.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from airflow.sdk.execution_time import macros

    dag = module.dag
    assert dag.max_active_runs == 1
    task = dag.get_task("anonymize")
    assert (task.py_options, task.py_file) == (["-m"], "kvtrace.nightly")
    assert importlib.util.find_spec(task.py_file) is not None
    rendered = task.render_template(task.pipeline_options, {"ds": "2026-11-21", "macros": macros})
    assert rendered["date"] == "2026-11-20"
    assert [Path(c).name for c in rendered["config"]] == ["deepseek-r1.yaml", "dataflow.yaml"]
    for config in rendered["config"]:
        assert (ROOT / "configs" / Path(config).name).is_file()


@pytest.mark.slow  # over a second: .ci/run runs the slow set
def test_the_launcher_entry_point_takes_beam_style_underscored_options(tiny_tokenizer, tmp_path):
    (tmp_path / "logs" / "2026-11-20").mkdir(parents=True)
    write_jsonl(tmp_path / "logs" / "2026-11-20" / "a.jsonl", [chat(i, 10 * i) for i in range(5)])
    preset = tmp_path / "site.yaml"
    preset.write_text(
        f"tokenizer: {tiny_tokenizer}\ninput: {tmp_path}/logs/{{date}}/*.jsonl\n"
        f"output: {tmp_path}/traces/{{date}}\n"
    )
    salt = tmp_path / "salt"
    salt.write_text("a-salt-long-enough-for-kvtrace")
    # As the Flex Template launcher and Airflow's operator call it: python FILE --name=value.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvtrace.nightly",
            f"--config={preset}",
            "--date=2026-11-20",
            f"--id_map={tmp_path}/map",
            f"--salt_file={salt}",
            "--block_size=4",
            "--direct_num_workers=1",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "traces" / "2026-11-20" / "manifest.json").is_file()
    assert (tmp_path / "map" / "CURRENT").is_file()


@pytest.mark.parametrize("bad", ["block-sise: 16\n", "runner: DataflowRunner\n"])
def test_unknown_preset_keys_are_an_error_not_ignored(tiny_tokenizer, tmp_path, capsys, bad):
    from kvtrace.cli import main

    preset = tmp_path / "typo.yaml"
    preset.write_text(bad)
    assert (
        main(
            [
                "anonymize",
                "--config",
                str(preset),
                "--input",
                "x",
                "--output",
                "y",
                "--tokenizer",
                tiny_tokenizer,
            ]
        )
        == 2
    )
    assert "unknown option(s) in --config" in capsys.readouterr().err


# Every Kubernetes manifest deploy/render.sh fills in, and the values file it fills them from.
MANIFESTS = (
    "flink/rbac.yaml",
    "flink/flink-session.yaml",
    "schedule/cronjob.yaml",
    "kafka/streaming.yaml",
)
# The preset of configs/ it fills in too: Dataflow's.
DATAFLOW_PRESET = ROOT / "configs" / "dataflow.yaml"
PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")


def value_names() -> list[str]:
    text = (DEPLOY / "values.env").read_text()
    return re.findall(r"^([A-Z_]+)=\S", text, flags=re.M)


def rendered(tmp_path: Path) -> dict[str, list[dict]]:
    """The manifests as deploy/render.sh writes them from the shipped values.env."""
    render_deploy(tmp_path / "out")
    return {
        name: list(yaml.safe_load_all((tmp_path / "out" / name).read_text())) for name in MANIFESTS
    }


def schema_errors(document: dict) -> list[str]:
    """What the API server (with the operator's CRD installed) would refuse in document, from
    the schemas vendored in deploy/schemas (their README says whence): no network."""
    if document["kind"] == "FlinkDeployment":
        schema = json.loads((DEPLOY / "schemas" / "flinkdeployment-v1beta1.json").read_text())
    else:
        kubernetes = json.loads((DEPLOY / "schemas" / "kubernetes-v1.33.json").read_text())
        kind = dict(kubernetes["kinds"][document["kind"]])
        kind.pop("$id")
        schema = {**kind, "$defs": kubernetes["$defs"]}
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(document)
    ]


def test_every_manifest_is_valid_for_kubernetes_and_the_flink_operator(tmp_path):
    kinds = []
    for name, documents_of in rendered(tmp_path).items():
        for document in documents_of:
            kinds.append(document["kind"])
            assert schema_errors(document) == [], (name, document["kind"])
    assert sorted(set(kinds)) == [
        "CronJob",
        "Deployment",
        "FlinkDeployment",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]


def test_the_schemas_refuse_what_the_cluster_would_refuse(tmp_path):
    manifests = rendered(tmp_path)
    flink = next(d for d in manifests["flink/flink-session.yaml"] if d["kind"] == "FlinkDeployment")
    flink["spec"]["taskManagers"] = flink["spec"].pop("taskManager")  # a misspelt field
    assert any("taskManagers" in error for error in schema_errors(flink))
    cronjob = manifests["schedule/cronjob.yaml"][0]
    cronjob["spec"]["startingDeadlineSeconds"] = "an hour"  # seconds, a number
    assert any("startingDeadlineSeconds" in error for error in schema_errors(cronjob))
    account = manifests["flink/rbac.yaml"][0]
    account["metadata"]["annotations"] = {"role": 7}  # annotations are strings
    assert schema_errors(account)


def test_every_value_to_fill_in_is_named_in_values_env_and_only_there(tmp_path):
    names = value_names()
    assert len(names) == len(set(names))
    used: set[str] = set()
    for template in [*(DEPLOY / name for name in MANIFESTS), DATAFLOW_PRESET]:
        text = template.read_text()
        used |= set(PLACEHOLDER.findall(text))
        # The shipped examples' site-specific values live in values.env, nowhere else.
        assert "example" not in text, template
    assert used == set(names)
    for name, documents_of in rendered(tmp_path).items():
        assert "${" not in (tmp_path / "out" / name).read_text(), name
        assert documents_of
    for preset in (tmp_path / "out" / "configs").iterdir():
        assert "${" not in preset.read_text(), preset.name


# A site's Dataflow values, each unlike the shipped examples, so that each is seen where it goes.
SITE = {
    "KVTRACE_GCP_PROJECT": "acme-inference",
    "KVTRACE_GCP_REGION": "us-central1",
    "KVTRACE_BUCKET": "acme-logs",
    "KVTRACE_OPS_BUCKET": "acme-ops",
    "KVTRACE_DATAFLOW_SERVICE_ACCOUNT": "kvtrace@acme-inference.iam.gserviceaccount.com",
    "KVTRACE_IMAGE": "us-central1-docker.pkg.dev/acme-inference/kvtrace/kvtrace:abc123",
}


def test_the_dataflow_preset_renders_the_sites_values_into_a_night(tmp_path):
    presets = render_deploy(tmp_path / "out", **SITE) / "configs"
    # One folder holds a night's presets: the others copied as they are.
    for preset in (ROOT / "configs").glob("*.yaml"):
        if preset != DATAFLOW_PRESET:
            assert (presets / preset.name).read_bytes() == preset.read_bytes(), preset.name
    options, beam = load_presets(
        [str(presets / "deepseek-r1.yaml"), str(presets / "dataflow.yaml")]
    )
    assert {f"--{k.replace('_', '-')}" for k in options} <= anonymize_flags()
    night = fill_dates(options, parse_date("2026-11-20"))
    assert night["input"] == "gs://acme-logs/logs/2026-11-20/*.jsonl.gz"
    assert night["output"] == "gs://acme-logs/traces/2026-11-20"
    assert night["dead_letter"] == "gs://acme-logs/rejected/2026-11-20"
    assert night["id_map"] == "gs://acme-logs/id-maps/main"
    assert night["id_map_marks"] == "gs://acme-ops/id-map-marks"
    assert night["salt_secret"] == "projects/acme-inference/secrets/kvtrace-salt/versions/1"
    assert beam["runner"] == "DataflowRunner"
    assert (beam["project"], beam["region"]) == ("acme-inference", "us-central1")
    assert beam["service_account_email"] == SITE["KVTRACE_DATAFLOW_SERVICE_ACCOUNT"]
    assert beam["sdk_container_image"] == SITE["KVTRACE_IMAGE"]
    assert beam["temp_location"].startswith("gs://acme-logs/")
    assert beam["staging_location"].startswith("gs://acme-logs/")


@pytest.mark.parametrize("name", ["KVTRACE_BUCKET", "KVTRACE_GCP_PROJECT"])
def test_render_refuses_a_value_left_empty(tmp_path, name):
    with pytest.raises(subprocess.CalledProcessError) as refused:
        render_deploy(tmp_path / "out", **{name: ""})
    assert f"{name} is empty".encode() in refused.value.stderr
    assert not (tmp_path / "out").exists()  # refused before anything is written


def pod_specs(document: dict) -> list[dict]:
    if document["kind"] == "CronJob":
        return [document["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    if document["kind"] == "Deployment":
        return [document["spec"]["template"]["spec"]]
    return []


def test_every_pod_that_touches_the_object_store_runs_as_the_kvtrace_account(tmp_path):
    manifests = rendered(tmp_path)
    account, role, binding = manifests["flink/rbac.yaml"]
    assert account["metadata"]["name"] == "kvtrace" and account["metadata"]["annotations"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == "kvtrace"
    flink = next(d for d in manifests["flink/flink-session.yaml"] if d["kind"] == "FlinkDeployment")
    assert flink["spec"]["serviceAccount"] == "kvtrace"
    launchers = manifests["schedule/cronjob.yaml"] + manifests["kafka/streaming.yaml"]
    for spec in (s for d in launchers for s in pod_specs(d)):
        assert spec["serviceAccountName"] == "kvtrace"
    # Without a cloud identity, the optional Secret reaches each container that reads or writes.
    pool = flink["spec"]["taskManager"]["podTemplate"]["spec"]["containers"][1]
    main = flink["spec"]["podTemplate"]["spec"]["containers"][0]
    containers = [pool, main] + [
        c for d in launchers for s in pod_specs(d) for c in s["containers"]
    ]
    for container in containers:
        assert {"secretRef": {"name": "kvtrace-object-store", "optional": True}} in container[
            "envFrom"
        ]


def test_the_kafka_stream_reaches_the_expansion_service_with_the_flink_presets_options():
    manifests = documents(DEPLOY / "flink" / "flink-session.yaml")
    launcher = yaml.safe_load((DEPLOY / "kafka" / "streaming.yaml").read_text())
    container = launcher["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    host, port = env["KVTRACE_KAFKA_EXPANSION"].split(":")
    service = manifests["Service"]
    assert host == service["metadata"]["name"]
    assert {"name": "kafka-expansion", "port": int(port)} in service["spec"]["ports"]
    expansion = next(
        c
        for c in manifests["Deployment"]["spec"]["template"]["spec"]["containers"]
        if c["name"] == "kafka-expansion"
    )
    assert expansion["args"][:2] == ["org.apache.beam.sdk.expansion.service.ExpansionService", port]
    # The same flags as local-cluster.sh's expansion service, which the Kafka e2e test runs.
    script = (DEPLOY / "flink" / "local-cluster.sh").read_text()
    assert all(flag in script for flag in expansion["args"][2:])
    beam_flags = dict(a[2:].split("=", 1) for a in container["args"] if "=" in a)
    _, beam = load_presets([str(ROOT / "configs/flink.yaml")])
    assert beam_flags == {k: str(v) for k, v in beam.items()}
    args = container["args"]
    assert "--streaming" in args and args[args.index("--input") + 1].startswith("kafka://")


def test_the_job_server_image_is_the_local_clusters_classpath():
    text = (DEPLOY / "docker" / "Dockerfile.jobserver").read_text()
    assert "COPY deploy/flink/job-server/pom.xml" in text
    script = (DEPLOY / "flink" / "local-cluster.sh").read_text()
    local_opens = re.search(r"java_opens=\((.*?)\)", script, re.S).group(1).split()
    assert re.findall(r'"(--add-(?:opens|exports)=[^"]+)"', text) == local_opens


def test_the_unrendered_dataflow_preset_is_refused_saying_how_to_render_it(capsys):
    from kvtrace.cli import main

    configs = ["--config", "deepseek-r1", "--config", str(DATAFLOW_PRESET)]
    assert main(["anonymize", *configs, "--date", "2026-11-20"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert "${KVTRACE_BUCKET} not filled in" in error
    assert "render it with deploy/render.sh" in error


def stub_cloud(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """docker and gcloud that record their arguments (one call a line) in the calls file; docker
    build copies the build context's CONFIGS folder to tmp_path/image-configs, as the image
    would hold it. No daemon, no cloud: what the scripts would ask of them."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for tool in ("docker", "gcloud"):
        (bin_dir / tool).write_text(
            "#!/usr/bin/env bash\n"
            f'printf "%s\\n" "{tool} $*" >>"{calls}"\n'
            'if [ "$1" = build ]; then\n'
            '  for arg; do case "$arg" in CONFIGS=*)\n'
            f'    cp -r "${{@: -1}}/${{arg#CONFIGS=}}" "{tmp_path}/image-configs";; esac; done\n'
            "fi\n"
        )
        (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


def site_values(tmp_path: Path) -> Path:
    """A site's copy of deploy/values.env holding SITE's values."""
    text = (DEPLOY / "values.env").read_text()
    for name, value in SITE.items():
        text = re.sub(rf"^{name}=.*$", f"{name}={value}", text, flags=re.M)
    (tmp_path / "site.env").write_text(text)
    return tmp_path / "site.env"


def test_the_flex_template_image_holds_the_sites_rendered_presets(tmp_path):
    env, calls = stub_cloud(tmp_path)
    site = site_values(tmp_path)
    built = subprocess.run(
        [str(DEPLOY / "dataflow" / "build.sh"), str(site)], env=env, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    docker_build, docker_push, template = calls.read_text().splitlines()
    image = SITE["KVTRACE_IMAGE"]  # the values file's, never a path the script makes up
    assert f"-t {image} " in docker_build and "--build-arg CONFIGS=" in docker_build
    assert docker_push == f"docker push {image}"
    assert template.startswith("gcloud dataflow flex-template build gs://acme-logs/templates/")
    assert f"--image {image}" in template and "--project acme-inference" in template
    # The image's presets are render.sh's from the same values: the template runs a filled one.
    image_configs = tmp_path / "image-configs"
    assert (image_configs / "dataflow.yaml").read_bytes() == (
        render_deploy(tmp_path / "out", **SITE) / "configs" / "dataflow.yaml"
    ).read_bytes()
    assert "${" not in (image_configs / "dataflow.yaml").read_text()
    assert not list(ROOT.glob(".dataflow-build.*"))  # the rendered copy goes with the build

    ran = subprocess.run(
        [str(DEPLOY / "dataflow" / "run.sh"), str(site), "2026-11-20"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr
    run = calls.read_text().splitlines()[-1]
    assert run.startswith("gcloud dataflow flex-template run kvtrace-2026-11-20 ")
    assert "--project acme-inference --region us-central1 " in run
    assert "gs://acme-logs/templates/kvtrace-anonymize.json" in run
    assert (
        f"config=configs/deepseek-r1.yaml,configs/dataflow.yaml~sdk_container_image={image}~" in run
    )


def test_the_dataflow_scripts_refuse_a_value_left_empty(tmp_path):
    env, calls = stub_cloud(tmp_path)
    site = site_values(tmp_path)
    site.write_text(re.sub(r"^KVTRACE_IMAGE=.*$", "KVTRACE_IMAGE=", site.read_text(), flags=re.M))
    for script, args in (("build.sh", []), ("run.sh", ["2026-11-20"])):
        done = subprocess.run(
            [str(DEPLOY / "dataflow" / script), str(site), *args],
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode != 0 and "KVTRACE_IMAGE is empty" in done.stderr, script
    assert not calls.exists()  # nothing built, pushed or started
