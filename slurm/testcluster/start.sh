#!/usr/bin/env bash
# Start a local multi-node Slurm cluster on this one machine, all state under STATE_DIR.
#
#   start.sh STATE_DIR [NODES]        (NODES: number of slurmd "nodes", default 3)
#
# Brings up a private munged (own key, socket, pid, log, seed under STATE_DIR), slurmctld
# and one slurmd per node (node1..nodeN), each slurmd on 127.0.0.1 with its own Port=.
# Waits until every node is idle. Writes STATE_DIR/cluster.env (SLURM_CONF=..., node
# names, ports) and STATE_DIR/pids ("name pid" per daemon, in start order). Stop with
# stop.sh STATE_DIR, which kills exactly those PIDs.
#
# Environment knobs:
#   DEDAL_TC_CPUS      CPUs per node (default 2)
#   DEDAL_TC_MEM       RealMemory per node in MB (default: MemTotal/NODES, at most 8000)
#   DEDAL_TC_PORT      first port (slurmctld; slurmds take the next NODES ports); default: a free range
#   DEDAL_TC_TIMEOUT   seconds to wait for the nodes to become idle (default 60)
#   DEDAL_TC_CLUSTER   ClusterName (default dedaltc)
# Needs root (slurmd launches jobs as their users), munge and Slurm (Debian: munge slurm-wlm).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
die() { echo "testcluster: error: $*" >&2; exit 1; }

[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: start.sh STATE_DIR [NODES]"
NODES=${2:-3}
[[ $NODES =~ ^[1-9][0-9]*$ ]] && [ "$NODES" -le 64 ] || die "NODES must be a number from 1 to 64, got '$NODES'"
CPUS=${DEDAL_TC_CPUS:-2}
[[ $CPUS =~ ^[1-9][0-9]*$ ]] || die "DEDAL_TC_CPUS must be a positive number, got '$CPUS'"
TIMEOUT=${DEDAL_TC_TIMEOUT:-60}
CLUSTER=${DEDAL_TC_CLUSTER:-dedaltc}
[ "$(id -u)" = 0 ] || die "must run as root (slurmd launches jobs as their users)"
for tool in munged munge unmunge slurmctld slurmd sinfo scontrol scancel squeue srun; do
  command -v "$tool" >/dev/null || die "$tool not found (apt-get install munge slurm-wlm)"
done

mkdir -p "$1"
STATE_DIR=$(cd "$1" && pwd)
case $STATE_DIR in *[[:space:]]*) die "STATE_DIR must not contain blanks: '$STATE_DIR'";; esac
# munged and slurmd put Unix sockets under STATE_DIR; such paths are limited to 107 bytes
[ ${#STATE_DIR} -le 80 ] || die "STATE_DIR is too long for Unix socket paths (${#STATE_DIR} > 80 characters): $STATE_DIR"
PIDS=$STATE_DIR/pids

# refuse to start twice in one directory; forget PIDs of daemons that are gone
if [ -f "$PIDS" ]; then
  while read -r name pid; do
    if [ -n "${pid:-}" ] && kill -0 "$pid" 2>/dev/null && grep -qa "$name" "/proc/$pid/cmdline" 2>/dev/null; then
      die "a test cluster is already running in $STATE_DIR ($name, pid $pid); stop it with $HERE/stop.sh $STATE_DIR"
    fi
  done < "$PIDS"
  rm -f "$PIDS"
fi

started=0
fail() {
  echo "testcluster: error: $*" >&2
  for f in "$STATE_DIR"/log/*.log "$STATE_DIR"/log/*.out; do
    [ -s "$f" ] || continue
    # a daemon's stdout (*.out) repeats its log file; show it only when there is no log
    case $f in *.out) [ -s "${f%.out}.log" ] && continue ;; esac
    echo "--- tail of $f" >&2
    tail -n 15 "$f" >&2
  done
  [ "$started" = 1 ] && "$HERE/stop.sh" "$STATE_DIR" >&2 || true
  exit 1
}
trap 'fail "command failed at line $LINENO: $BASH_COMMAND"' ERR

rm -rf "$STATE_DIR/run" "$STATE_DIR/ctld" "$STATE_DIR/spool"
mkdir -p "$STATE_DIR/run" "$STATE_DIR/ctld" "$STATE_DIR/log"
# munged wants its socket directory writable by root only and searchable by all; --force
# below turns its complaint about a private ancestor (e.g. pytest's 0700 tmp dirs) into a warning
chmod 755 "$STATE_DIR/run"
: > "$STATE_DIR/log/slurmctld.log"
for i in $(seq 1 "$NODES"); do mkdir -p "$STATE_DIR/spool/node$i"; done

# --- ports: PORT for slurmctld, PORT+i for slurmd of node i; all must be free
port_free() {
  if command -v ss >/dev/null; then
    [ -z "$(ss -Htan "sport = :$1" 2>/dev/null)" ]
  else
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}
range_free() {
  local p
  for p in $(seq "$1" $(($1 + NODES))); do port_free "$p" || return 1; done
}
if [ -n "${DEDAL_TC_PORT:-}" ]; then
  PORT=$DEDAL_TC_PORT
  range_free "$PORT" || fail "ports $PORT..$((PORT + NODES)) are not all free"
else
  PORT=""
  for _ in $(seq 1 50); do
    cand=$((20000 + (RANDOM * 32768 + RANDOM) % 30000))
    if range_free "$cand"; then PORT=$cand; break; fi
  done
  [ -n "$PORT" ] || fail "no free range of $((NODES + 1)) ports found"
fi

# --- memory per node (bookkeeping only: nothing is enforced without cgroups)
if [ -n "${DEDAL_TC_MEM:-}" ]; then
  MEM=$DEDAL_TC_MEM
else
  total=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
  MEM=$((total / NODES))
  [ "$MEM" -le 8000 ] || MEM=8000
  [ "$MEM" -ge 100 ] || MEM=100
fi
MEM_PER_CPU=$((MEM / CPUS))

# --- slurm.conf from the template
HOST=$(hostname -s 2>/dev/null || hostname)
NODE_LINES=""
for i in $(seq 1 "$NODES"); do
  NODE_LINES+="NodeName=node$i NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((PORT + i)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"$'\n'
done
PART_LINES="PartitionName=debug Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
[ "$NODES" = 1 ] && PART_LINES="PartitionName=debug Nodes=node1 Default=YES MaxTime=INFINITE State=UP"
CONF=$STATE_DIR/slurm.conf
{
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in
      @NODES@) printf '%s' "$NODE_LINES" ;;
      @PARTITIONS@) printf '%s\n' "$PART_LINES" ;;
      *)
        line=${line//@STATE_DIR@/$STATE_DIR}
        line=${line//@CLUSTER@/$CLUSTER}
        line=${line//@CTLD_PORT@/$PORT}
        line=${line//@MEM_PER_CPU@/$MEM_PER_CPU}
        printf '%s\n' "$line" ;;
    esac
  done < "$HERE/slurm.conf.in"
} > "$CONF.tmp"
mv "$CONF.tmp" "$CONF"
export SLURM_CONF=$CONF

# --- daemons: started in the foreground in their own session, PIDs recorded at once
launch() {  # launch NAME LOGNAME CMD...
  local name=$1 log=$2 pid
  shift 2
  setsid "$@" < /dev/null >> "$STATE_DIR/log/$log.out" 2>&1 &
  pid=$!
  echo "$name $pid" >> "$PIDS"
  started=1
}
wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local secs=$1 what=$2 t0=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    alive
    [ $((SECONDS - t0)) -lt "$secs" ] || fail "$what did not happen within $secs s"
    sleep 0.2
  done
}
alive() {
  local name pid
  while read -r name pid; do
    # a zombie has an empty command line
    grep -qa "$name" "/proc/$pid/cmdline" 2>/dev/null || fail "$name (pid $pid) exited early"
  done < "$PIDS"
}

SOCK=$STATE_DIR/run/munge.socket
KEY=$STATE_DIR/munge.key
[ -s "$KEY" ] || { head -c 1024 /dev/urandom > "$KEY.tmp"; chmod 600 "$KEY.tmp"; mv "$KEY.tmp" "$KEY"; }
chmod 600 "$KEY"
launch munged munged munged --foreground --force --socket="$SOCK" --key-file="$KEY" \
  --pid-file="$STATE_DIR/run/munged.pid" --log-file="$STATE_DIR/log/munged.log" \
  --seed-file="$STATE_DIR/run/munged.seed"
wait_for 15 "munged socket $SOCK" bash -c "munge -S '$SOCK' -n | unmunge -S '$SOCK'"

launch slurmctld slurmctld slurmctld -D -i
wait_for 30 "slurmctld answering on port $PORT" scontrol ping

for i in $(seq 1 "$NODES"); do
  launch slurmd "slurmd-node$i" slurmd -D -N "node$i"
done

# --- all nodes idle (bounded)
t0=$SECONDS
while :; do
  alive
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || true
  idle=$(printf '%s\n' "$states" | awk '$2 == "idle"' | wc -l)
  [ "$idle" -ge "$NODES" ] && break
  [ $((SECONDS - t0)) -lt "$TIMEOUT" ] || fail "nodes not idle after $TIMEOUT s: $(echo $states)"
  sleep 0.3
done
# slurmctld schedules its first job only a few seconds after start: one step on every
# node proves that scheduling works and that each slurmd can launch
left=$((TIMEOUT - (SECONDS - t0)))
[ "$left" -ge 10 ] || left=10
timeout "$left" srun --quiet -N "$NODES" -n "$NODES" --mem-per-cpu=1 -J testcluster-probe true \
  || fail "probe job (srun -N $NODES true) did not run within $left s"
trap - ERR

NODE_NAMES=$(for i in $(seq 1 "$NODES"); do printf 'node%s ' "$i"; done)
cat > "$STATE_DIR/cluster.env.tmp" <<EOF
SLURM_CONF=$CONF
DEDAL_TC_STATE_DIR=$STATE_DIR
DEDAL_TC_NODES=${NODE_NAMES% }
DEDAL_TC_CPUS=$CPUS
DEDAL_TC_MEM=$MEM
DEDAL_TC_PORT=$PORT
DEDAL_TC_PARTITION=debug
DEDAL_TC_MUNGE_SOCKET=$SOCK
EOF
mv "$STATE_DIR/cluster.env.tmp" "$STATE_DIR/cluster.env"
echo "testcluster: $NODES nodes idle (node1..node$NODES, $CPUS CPUs, $MEM MB each), slurmctld on 127.0.0.1:$PORT, after $((SECONDS)) s"
echo "export SLURM_CONF=$CONF"
