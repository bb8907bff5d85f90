#!/usr/bin/env bash
# A Kafka broker on loopback (KRaft: broker and controller in one process), for
# `kvtrace anonymize --streaming --input kafka://127.0.0.1:PORT/TOPIC` on this machine and its tests.
#
#   deploy/kafka/local-broker.sh start [PORT [CONTROLLER_PORT]]   # installs on first use;
#       returns once it serves (the controller listens on PORT+1 unless given)
#   deploy/kafka/local-broker.sh produce PORT TOPIC < messages   # one message per line
#   deploy/kafka/local-broker.sh stop
#
# Kafka comes as a classpath Maven resolves from Maven Central (broker/pom.xml); nothing is
# fetched by URL. Needs java 17 and mvn. State: KVTRACE_KAFKA_HOME (default ~/.cache/kvtrace/kafka).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
home="${KVTRACE_KAFKA_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtrace/kafka}"
start_timeout_s=120  # a cold JVM on a busy 2-core machine

die() { echo "local-broker: $*" >&2; exit 1; }

classpath() {  # resolved again whenever broker/pom.xml changes
  local pom_sum; pom_sum=$(sha256sum "$here/broker/pom.xml" | cut -d' ' -f1)
  if [ ! -f "$home/classpath" ] || [ "$(cat "$home/pom.sha256" 2>/dev/null)" != "$pom_sum" ]; then
    command -v java >/dev/null || die "java not found (OpenJDK 17 is needed)"
    command -v mvn >/dev/null || die "mvn not found (Maven resolves Kafka)"
    mkdir -p "$home"
    mvn -B -q -Dstyle.color=never -f "$here/broker/pom.xml" dependency:build-classpath \
      -Dmdep.outputFile="$home/classpath.part" >&2 || die "Maven could not resolve Kafka (see above)"
    mv "$home/classpath.part" "$home/classpath"
    echo "$pom_sum" > "$home/pom.sha256"
  fi
  cat "$home/classpath"
}

start() {
  local port="${1:-9092}" cp
  local controller="${2:-$((port + 1))}"
  cp=$(classpath)
  if [ -f "$home/pid" ] && kill -0 "$(cat "$home/pid")" 2>/dev/null; then
    echo "export KVTRACE_KAFKA=$(cat "$home/address")"; return
  fi
  # The broker would exit at once, saying nothing (its logging has no backend), on a taken port.
  for taken in "$port" "$controller"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$taken") 2>/dev/null; then
      die "port $taken on 127.0.0.1 is in use; give others: start PORT CONTROLLER_PORT"
    fi
  done
  rm -rf "$home/data" && mkdir -p "$home/data"
  cat > "$home/server.properties" <<PROPERTIES
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$home/data
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPERTIES
  java -cp "$cp" kafka.tools.StorageTool format -t "$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)" \
    -c "$home/server.properties" >"$home/format.log" 2>&1 || die "could not format its storage: $home/format.log"
  setsid java -Xmx512m -cp "$cp" kafka.Kafka "$home/server.properties" >"$home/broker.log" 2>&1 &
  echo $! > "$home/pid"
  echo "127.0.0.1:$port" > "$home/address"
  for _ in $(seq "$start_timeout_s"); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "export KVTRACE_KAFKA=127.0.0.1:$port"; return
    fi
    kill -0 "$(cat "$home/pid")" 2>/dev/null || break
    sleep 1
  done
  tail -5 "$home/broker.log" >&2
  stop
  die "the broker did not start; its log: $home/broker.log"
}

produce() {
  [ $# -eq 2 ] || die "usage: $0 produce PORT TOPIC < messages"
  java -cp "$(classpath)" org.apache.kafka.tools.ConsoleProducer \
    --bootstrap-server "127.0.0.1:$1" --topic "$2" >/dev/null
}

stop() {
  if [ -f "$home/pid" ]; then
    kill -- -"$(cat "$home/pid")" 2>/dev/null || kill "$(cat "$home/pid")" 2>/dev/null || true
    rm -f "$home/pid"
  fi
}

case "${1:-}" in
  start) start "${2:-}" "${3:-}" ;;
  produce) shift; produce "$@" ;;
  stop) stop ;;
  *) echo "usage: $0 start [PORT [CONTROLLER_PORT]] | produce PORT TOPIC < messages | stop" >&2
     exit 2 ;;
esac
