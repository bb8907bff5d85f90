#!/usr/bin/env bash
# A Flink session cluster on this machine, loopback only, with Beam's Flink job server in front:
# what CI and `kvtrace anonymize --config configs/flink-local.yaml` run on.
#
#   deploy/flink/local-cluster.sh start   # installs on first use, returns once jobs are accepted
#   deploy/flink/local-cluster.sh python -m kvtrace.cli anonymize --config configs/flink-local.yaml ...
#   deploy/flink/local-cluster.sh stop
#   deploy/flink/local-cluster.sh status
#   deploy/flink/local-cluster.sh cancel-jobs   # streams run until cancelled here
#   deploy/flink/local-cluster.sh kill-taskmanager   # a fault drill: SIGKILL; it comes back
#
# Flink comes from its registry package (apache-flink-libraries on PyPI: the distribution's jars),
# the job server as a classpath that Maven resolves from Maven Central (job-server/pom.xml);
# nothing is fetched by URL at run time. Versions: versions.env. Needs java 17, mvn, python 3.11+.
# Jobs are submitted, and their Python parts run, with Beam's SDK at the job server's release:
# `local-cluster.sh python ARGS` runs python in an environment of its own (apache-beam at
# versions.env's BEAM_VERSION, kvtrace's other dependencies, pytest for the Flink tests) with this
# checkout on its path.
# The TaskManager runs under a supervisor that starts it again when it dies, as Kubernetes
# restarts a pod: Flink's restart strategy (below) then re-runs the failed work on it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
home="${KVTRACE_FLINK_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtrace/flink-$FLINK_VERSION-beam-$BEAM_VERSION}"
run="$home/run"
rest_port="${KVTRACE_FLINK_REST_PORT:-8081}"
job_port="${KVTRACE_FLINK_JOB_PORT:-8099}"
artifact_port="${KVTRACE_FLINK_ARTIFACT_PORT:-8098}"
expansion_port="${KVTRACE_FLINK_EXPANSION_PORT:-8097}"
# Beam's expansion service for Java transforms run inside the TaskManager (EMBEDDED): Kafka reads.
kafka_expansion_port="${KVTRACE_KAFKA_EXPANSION_PORT:-8096}"
slots="${KVTRACE_FLINK_SLOTS:-2}"
# What Flink's own scripts pass to Java 17 (its config's env.java.opts.all).
java_opens=(--add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.net=ALL-UNNAMED
  --add-opens=java.base/java.io=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED --add-opens=java.base/java.lang.reflect=ALL-UNNAMED
  --add-opens=java.base/java.text=ALL-UNNAMED --add-opens=java.base/java.time=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED
  --add-exports=java.base/sun.net.util=ALL-UNNAMED)

die() { echo "local-cluster: $*" >&2; exit 1; }

install() {  # the Flink jars once per version; the job server's classpath whenever its pom changes
  local pom_sum; pom_sum=$(sha256sum "$here/job-server/pom.xml" | cut -d' ' -f1)
  if [ -f "$home/flink/lib/flink-dist-$FLINK_VERSION.jar" ]; then
    [ -f "$home/job-server.classpath" ] && [ "$(cat "$home/job-server.pom.sha256" 2>/dev/null)" = "$pom_sum" ] \
      || resolve_job_server "$pom_sum"
    install_python
    return
  fi
  command -v java >/dev/null || die "java not found (OpenJDK 17 is needed)"
  command -v mvn >/dev/null || die "mvn not found (Maven resolves Beam's job server)"
  mkdir -p "$home/download"
  echo "local-cluster: installing Flink $FLINK_VERSION and Beam's job server $BEAM_VERSION in $home" >&2
  python -m pip download -q --no-deps --no-binary :all: -d "$home/download" \
    "apache-flink-libraries==$FLINK_VERSION" || die "pip could not fetch apache-flink-libraries==$FLINK_VERSION"
  rm -rf "$home/flink" && mkdir -p "$home/flink"
  tar xzf "$home/download/apache-flink-libraries-$FLINK_VERSION.tar.gz" -C "$home/flink" \
    --strip-components=2 "apache-flink-libraries-$FLINK_VERSION/deps/lib" \
    "apache-flink-libraries-$FLINK_VERSION/deps/bin"
  rm -rf "$home/download"
  resolve_job_server "$pom_sum"
  install_python
}

install_python() {  # the Flink runs' Python, again whenever kvtrace's dependencies or the pin change
  local requirements
  requirements=$(python - "$repo/pyproject.toml" "$BEAM_VERSION" <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
# What the Flink tests import beyond kvtrace (tests/conftest.py), at the test extra's pins.
testing = {"pytest", "pytest-xdist", "hypothesis"}
extra = [d for d in project["optional-dependencies"]["test"] if d.split(">")[0].split("=")[0] in testing]
print(f"apache-beam=={sys.argv[2]}")
print(f"# kvtrace {project['version']}")  # a new release installs its metadata again
# Beam at the job server's release; pyarrow past Beam 2.62's bound, installed below.
print("\n".join(d for d in project["dependencies"] + extra if not d.startswith(("apache-beam", "pyarrow"))))
EOF
  ) || die "could not read kvtrace's dependencies (python 3.11+ is needed)"
  [ -x "$home/python/bin/python" ] && [ "$(cat "$home/python.requirements" 2>/dev/null)" = "$requirements" ] && return
  echo "local-cluster: installing the Flink runs' Python (apache-beam $BEAM_VERSION) in $home/python" >&2
  rm -rf "$home/python" "$home/python.requirements"
  python -m venv "$home/python" || die "python could not make a virtual environment"
  "$home/python/bin/python" -m pip install -q -r /dev/stdin <<<"$requirements" \
    || die "pip could not install the Flink runs' Python (see above)"
  # kvtrace's trace reader (the gate, `kvtrace audit`) streams JSON with pyarrow.json.open_json,
  # pyarrow 20+; Beam 2.62 declares pyarrow<17 for its own Arrow and Parquet IO, which kvtrace
  # does not use. The job API pair is what Beam supports; this one library goes past its bound,
  # to the release the local engine's python has: Parquet outputs name their writer's release.
  # kvtrace itself with no dependencies, for its metadata only (the release every manifest
  # records): PYTHONPATH puts this checkout's code first.
  local pyarrow="pyarrow>=20" release
  release=$(python -c 'import pyarrow; print(pyarrow.__version__)' 2>/dev/null) && pyarrow="pyarrow==$release"
  "$home/python/bin/python" -m pip install -q --no-deps "$pyarrow" "$repo" \
    || die "pip could not install pyarrow and kvtrace's metadata (see above)"
  echo "$requirements" >"$home/python.requirements"
}

resolve_job_server() {  # resolve_job_server POM_SHA256
  command -v mvn >/dev/null || die "mvn not found (Maven resolves Beam's job server)"
  mvn -B -q -Dstyle.color=never -f "$here/job-server/pom.xml" dependency:build-classpath \
    -Dmdep.outputFile="$home/job-server.classpath.part" >&2 || die "Maven could not resolve the job server (see above)"
  mv "$home/job-server.classpath.part" "$home/job-server.classpath"
  echo "$1" > "$home/job-server.pom.sha256"
}

write_config() {
  mkdir -p "$run/conf" "$run/log"
  cat >"$run/conf/config.yaml" <<EOF
jobmanager:
  bind-host: 127.0.0.1
  rpc: {address: 127.0.0.1, port: 6123}
  memory: {process: {size: 1024m}}
  execution: {failover-strategy: region}
taskmanager:
  bind-host: 127.0.0.1
  host: 127.0.0.1
  numberOfTaskSlots: $slots
  # Beam's pipelines hold many exchanges per slot: network buffers, not heap, run out first.
  # Each blocking result takes sort-shuffle buffers (512 by default): 64 is plenty here.
  # Beam's data plane to the SDK workers is gRPC on direct buffers, task off-heap memory (0 by
  # default): a job of 155 MB failed with "OutOfMemoryError: Direct buffer memory" without it.
  # Managed memory (Flink's sorts) fixed rather than 40% of the rest, so the heap keeps ~700m.
  # Each job loads Beam's classes anew: with the default 256m of metaspace the TaskManager
  # died of "OutOfMemoryError: Metaspace" at the fifth stream job of one cluster.
  memory:
    process: {size: 3712m}
    network: {min: 512m, max: 512m}
    task: {off-heap: {size: 512m}}
    managed: {size: 512m}
    jvm-metaspace: {size: 768m}
  network: {sort-shuffle: {min-buffers: 64}}
rest: {address: 127.0.0.1, bind-address: 127.0.0.1, port: $rest_port}
blob: {server: {port: "6124"}}
parallelism: {default: $slots}
# A TaskManager lost mid-job: the failed region runs again once a TaskManager is back.
restart-strategy:
  type: fixed-delay
  fixed-delay: {attempts: 20, delay: 2 s}
# Streaming jobs: state checkpointed every 10 s into files on this machine. Flink 1.19 reads
# the store from state.checkpoint-storage and state.checkpoints.dir (execution.checkpointing.dir
# is 1.20's); without them checkpoints go to the JobManager's memory, capped at 5 MB.
execution:
  checkpointing: {interval: 10 s}
state:
  checkpoint-storage: filesystem
  checkpoints: {dir: "file://$run/checkpoints"}
EOF
  # Flink's processes log through log4j 2; without a configuration they log nothing.
  cat >"$run/conf/log4j.properties" <<'EOF'
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = MainAppender
appender.main.name = MainAppender
appender.main.type = File
appender.main.fileName = ${sys:log.file}
appender.main.layout.type = PatternLayout
appender.main.layout.pattern = %d{yyyy-MM-dd HH:mm:ss,SSS} %-5p %-60c %x - %m%n
EOF
}

alive() { [ -f "$run/$1.pid" ] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null; }

wait_for() {  # wait_for WHAT SECONDS COMMAND...: poll until COMMAND succeeds
  local what=$1 deadline=$((SECONDS + $2)); shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "$what did not come up in time (logs: $run/log)"
    for process in jobmanager taskmanager jobserver expansion; do
      [ ! -f "$run/$process.pid" ] || alive "$process" || die "the $process exited (log: $run/log/$process.out)"
    done
    sleep 0.5
  done
}

slots_up() { curl -sf "http://127.0.0.1:$rest_port/overview" | grep -q "\"slots-total\":[1-9]"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  alive jobmanager && { echo "local-cluster: already running (job endpoint localhost:$job_port)"; return; }
  install
  write_config
  local lib="$home/flink/lib/*"
  java "${java_opens[@]}" -Xmx512m -Dlog.file="$run/log/jobmanager.log" -Dlog4j.configurationFile="$run/conf/log4j.properties" -cp "$lib" \
    org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint --configDir "$run/conf" \
    </dev/null >"$run/log/jobmanager.out" 2>&1 &
  echo $! >"$run/jobmanager.pid"
  # The TaskManager's JVM sizes and memory options, as Flink's own start script derives them.
  local params
  params=$(java -cp "$lib:$home/flink/bin/bash-java-utils.jar" \
    org.apache.flink.runtime.util.bash.BashJavaUtils GET_TM_RESOURCE_PARAMS --configDir "$run/conf" \
    2>/dev/null | grep BASH_JAVA_UTILS_EXEC_RESULT: | sed 's/BASH_JAVA_UTILS_EXEC_RESULT://')
  local jvm dynamic
  jvm=$(sed -n 1p <<<"$params") dynamic=$(sed -n 2p <<<"$params")
  [ -n "$jvm" ] || die "could not derive the TaskManager's memory settings"
  # shellcheck disable=SC2086  # the derived options are words
  (while [ -f "$run/jobmanager.pid" ]; do
     java "${java_opens[@]}" $jvm -Dlog.file="$run/log/taskmanager.log" -Dlog4j.configurationFile="$run/conf/log4j.properties" -cp "$lib" \
       org.apache.flink.runtime.taskexecutor.TaskManagerRunner --configDir "$run/conf" $dynamic \
       >>"$run/log/taskmanager.out" 2>&1 &
     echo $! >"$run/taskmanager.pid"
     wait $! || true
   done) </dev/null >/dev/null 2>&1 &
  echo $! >"$run/supervisor.pid"
  wait_for "the Flink cluster" 90 slots_up
  # A bounded heap (versions.env's JOB_SERVER_HEAP says why).
  java "${java_opens[@]}" -Xmx"$JOB_SERVER_HEAP" -cp "$(cat "$home/job-server.classpath")" \
    org.apache.beam.runners.flink.FlinkJobServerDriver --flink-master="127.0.0.1:$rest_port" \
    --job-host=127.0.0.1 --job-port="$job_port" --artifact-port="$artifact_port" \
    --expansion-port="$expansion_port" --flink-conf-dir="$run/conf" </dev/null >"$run/log/jobserver.out" 2>&1 &
  echo $! >"$run/jobserver.pid"
  wait_for "Beam's job server" 60 port_open "$job_port"
  java -cp "$(cat "$home/job-server.classpath")" \
    org.apache.beam.sdk.expansion.service.ExpansionService "$kafka_expansion_port" \
    --defaultEnvironmentType=EMBEDDED --experiments=use_deprecated_read \
    </dev/null >"$run/log/expansion.out" 2>&1 &
  echo $! >"$run/expansion.pid"
  wait_for "Beam's expansion service" 60 port_open "$kafka_expansion_port"
  echo "local-cluster: Flink $FLINK_VERSION at http://127.0.0.1:$rest_port, Beam job server $BEAM_VERSION at localhost:$job_port"
  echo "local-cluster: for kafka:// inputs, export KVTRACE_KAFKA_EXPANSION=localhost:$kafka_expansion_port"
}

stop() {
  local pid
  for process in supervisor expansion jobserver taskmanager jobmanager; do
    [ -f "$run/$process.pid" ] || continue
    pid=$(cat "$run/$process.pid")
    rm -f "$run/$process.pid"  # first: the supervisor stops restarting the TaskManager
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  done
  echo "local-cluster: stopped"
}

status() {
  for process in jobmanager taskmanager jobserver expansion; do
    if alive "$process"; then echo "$process: running"; else echo "$process: stopped"; fi
  done
}

cancel_jobs() {  # a stream runs until cancelled here: Beam's job server does not pass on a cancel
  local ids id
  ids=$(curl -sf "http://127.0.0.1:$rest_port/jobs" | python -c '
import json, sys
print(" ".join(j["id"] for j in json.load(sys.stdin)["jobs"] if j["status"] not in ("CANCELED", "FAILED", "FINISHED")))') \
    || die "the cluster does not answer at http://127.0.0.1:$rest_port"
  for id in $ids; do
    curl -sf -X PATCH "http://127.0.0.1:$rest_port/jobs/$id?mode=cancel" >/dev/null && echo "local-cluster: cancelled job $id"
  done
}

kill_taskmanager() {
  alive taskmanager || die "no TaskManager is running"
  local pid
  pid=$(cat "$run/taskmanager.pid")
  kill -9 "$pid"
  echo "local-cluster: killed TaskManager $pid; its supervisor starts another"
}

run_python() {  # Python with Beam's SDK at the job server's release and this checkout on its path
  [ -x "$home/python/bin/python" ] || install
  # Its bin first on PATH: the process workers Beam starts for a job run `python` as found there.
  PATH="$home/python/bin:$PATH" PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "$home/python/bin/python" "$@"
}

case "${1:-}" in
  start) start ;;
  python) shift; run_python "$@" ;;
  stop) stop ;;
  status) status ;;
  kill-taskmanager) kill_taskmanager ;;
  cancel-jobs) cancel_jobs ;;
  *) echo "usage: $0 start|stop|status|python ARGS|cancel-jobs|kill-taskmanager" >&2; exit 2 ;;
esac
