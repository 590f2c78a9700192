#!/usr/bin/env bash
# Start a local multi-node Slurm cluster on this one machine, all state under STATE_DIR.
#
#   start.sh STATE_DIR [NODES]        (NODES: number of slurmd "nodes", default 3)
#
# Brings up a private munged (own key, socket, pid, log, seed under STATE_DIR), slurmctld
# and one slurmd per node (node1..nodeN), each slurmd on 127.0.0.1 with its own Port=.
# With DEDAL_TC_NETNS=1 the nodes are separate as far as Slurm, PMIx, UCX and Open MPI can
# tell: each slurmd runs in its own network namespace (a veth on a private bridge, its own
# address, traffic only among the cluster's namespaces), its own mount namespace (private
# /dev/shm, /tmp, /run; the DEDAL_TC_SHARED paths shared like a parallel file system) and
# its own hostname (node-ns.sh); slurmctld listens on the bridge.
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
#   DEDAL_TC_NETNS     1: one network, mount and UTS namespace per node (default 0)
#   DEDAL_TC_SHARED    netns mode: colon-separated paths the nodes share with the host (the
#                      layer store, the mirror, ...); STATE_DIR is always shared
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
NETNS=${DEDAL_TC_NETNS:-0}
case $NETNS in 0|1) ;; *) die "DEDAL_TC_NETNS must be 0 or 1, got '$NETNS'" ;; esac
if [ "$NETNS" = 1 ]; then
  for tool in ip unshare nsenter; do command -v "$tool" >/dev/null || die "$tool not found (apt-get install iproute2 util-linux)"; done
  [ "$NODES" -le 200 ] || die "netns mode takes at most 200 nodes"
fi

mkdir -p "$1"
STATE_DIR=$(cd "$1" && pwd)
case $STATE_DIR in *[[:space:]]*) die "STATE_DIR must not contain blanks: '$STATE_DIR'";; esac
# munged and slurmd put Unix sockets under STATE_DIR; such paths are limited to 107 bytes
[ ${#STATE_DIR} -le 80 ] || die "STATE_DIR is too long for Unix socket paths (${#STATE_DIR} > 80 characters): $STATE_DIR"
PIDS=$STATE_DIR/pids
# netns mode: what every node shares with the host, as a parallel file system (cluster.env
# records it, so that a node brought back later is given the same)
SHARED="$STATE_DIR${DEDAL_TC_SHARED:+:$DEDAL_TC_SHARED}"

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

[ ! -f "$STATE_DIR/net" ] || die "namespaces of an earlier cluster are recorded in $STATE_DIR/net; run $HERE/stop.sh $STATE_DIR first"
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

# --- netns mode: a /24 of its own per cluster (from PORT), the host (slurmctld) at .254,
# node i at .i; the names carry PORT so that clusters side by side never meet
CTLD_HOST=localhost
SELECT_PARAMS=CR_Core_Memory
NODE_ADDR=()
if [ "$NETNS" = 1 ]; then
  NET="10.$((PORT / 256 % 256)).$((PORT % 256))"
  HOST_ADDR=$NET.254
  BRIDGE=dtcb$PORT
  CTLD_HOST="$(hostname -s 2>/dev/null || hostname)($HOST_ADDR)"
  # separate machines: least-loaded placement, as a site spreading jobs over its nodes
  SELECT_PARAMS=CR_Core_Memory,CR_LLN
  for i in $(seq 1 "$NODES"); do NODE_ADDR[i]=$NET.$i; done
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
  if [ "$NETNS" = 1 ]; then
    NODE_LINES+="NodeName=node$i NodeHostname=node$i NodeAddr=${NODE_ADDR[i]} Port=$((PORT + i)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"$'\n'
  else
    NODE_LINES+="NodeName=node$i NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((PORT + i)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"$'\n'
  fi
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
        line=${line//@CTLD_HOST@/$CTLD_HOST}
        line=${line//@SELECT_PARAMS@/$SELECT_PARAMS}
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
  local name pid state
  while read -r name pid; do
    # by the process state, not the command line: a slurmd of a namespaced node passes
    # through nsenter, unshare and node-ns.sh, and a command line read during an exec can
    # come back empty
    state=$(sed -e 's/.*) //' -e 's/ .*//' "/proc/$pid/stat" 2>/dev/null || true)
    case $state in ''|Z|X|x) fail "$name (pid $pid) exited early" ;; esac
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

# --- netns mode: the bridge, one namespace per node with its veth; each object is recorded
# in STATE_DIR/net before it exists, so that stop.sh removes whatever was made
if [ "$NETNS" = 1 ]; then
  NETREC=$STATE_DIR/net
  started=1
  echo "bridge $BRIDGE" >> "$NETREC"
  ip link add "$BRIDGE" type bridge
  ip addr add "$HOST_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  HOSTS=$STATE_DIR/hosts
  { echo "127.0.0.1 localhost"; echo "$HOST_ADDR $(hostname -s 2>/dev/null || hostname) ctld"
    for i in $(seq 1 "$NODES"); do echo "${NODE_ADDR[i]} node$i"; done; } > "$HOSTS"
  for i in $(seq 1 "$NODES"); do
    ns=dtc$PORT-node$i
    echo "netns $ns" >> "$NETREC"
    ip netns add "$ns"
    ip link add "dtcv${PORT}n$i" type veth peer name eth0 netns "$ns"
    ip link set "dtcv${PORT}n$i" master "$BRIDGE" up
    ip -n "$ns" addr add "${NODE_ADDR[i]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
fi

launch slurmctld slurmctld slurmctld -D -i
wait_for 30 "slurmctld answering on port $PORT" scontrol ping

for i in $(seq 1 "$NODES"); do
  if [ "$NETNS" = 1 ]; then
    DEDAL_TC_SHARED=$SHARED DEDAL_TC_HOSTS=$HOSTS \
      launch slurmd "slurmd-node$i" nsenter --net="/run/netns/dtc$PORT-node$i" \
      unshare --mount --uts --propagation private -- "$HERE/node-ns.sh" "node$i" -- slurmd -D -N "node$i"
  else
    launch slurmd "slurmd-node$i" slurmd -D -N "node$i"
  fi
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
DEDAL_TC_NETNS=$NETNS
DEDAL_TC_SHARED=$SHARED
DEDAL_TC_ADDRS=${NODE_ADDR[*]:-}
EOF
mv "$STATE_DIR/cluster.env.tmp" "$STATE_DIR/cluster.env"
where=127.0.0.1
[ "$NETNS" = 1 ] && where="$HOST_ADDR (nodes in network namespaces dtc$PORT-node1..$NODES on bridge $BRIDGE)"
echo "testcluster: $NODES nodes idle (node1..node$NODES, $CPUS CPUs, $MEM MB each), slurmctld on $where:$PORT, after $((SECONDS)) s"
echo "export SLURM_CONF=$CONF"
