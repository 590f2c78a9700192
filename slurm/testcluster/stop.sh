#!/usr/bin/env bash
# Stop the test cluster started by start.sh STATE_DIR.
#
#   stop.sh STATE_DIR
#
# Cancels the cluster's jobs, then stops the daemons recorded in STATE_DIR/pids by PID,
# in the reverse order of their start (slurmd, slurmctld, munged): SIGTERM, wait up to
# 10 s, then SIGKILL. A PID is only signalled while its command line still names the
# daemon, so a recycled PID is never hit. In netns mode it then kills what still runs in
# the nodes' namespaces and removes the namespaces and the bridge recorded in STATE_DIR/net.
# Logs and configuration stay in STATE_DIR.
# Safe to run twice, and on a directory where nothing runs.
set -uo pipefail

die() { echo "testcluster: error: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: stop.sh STATE_DIR"
[ -d "$1" ] || { echo "testcluster: $1 does not exist; nothing to stop"; exit 0; }
STATE_DIR=$(cd "$1" && pwd)
PIDS=$STATE_DIR/pids
NETREC=$STATE_DIR/net

remove_net() {  # the namespaces (and whatever still runs in them), then the bridge
  [ -f "$NETREC" ] || return 0
  local kind name pids
  while read -r kind name; do
    [ "$kind" = netns ] || continue
    pids=$(ip netns pids "$name" 2>/dev/null | tr '\n' ' ')
    # shellcheck disable=SC2086
    [ -z "${pids// /}" ] || kill -KILL $pids 2>/dev/null || true
    ip netns del "$name" 2>/dev/null || true
  done < "$NETREC"
  while read -r kind name; do
    [ "$kind" = bridge ] && { ip link del "$name" 2>/dev/null || true; }
  done < "$NETREC"
  rm -f "$NETREC"
}

[ -f "$PIDS" ] || { remove_net; echo "testcluster: nothing running in $STATE_DIR"; exit 0; }

ours() {  # ours NAME PID: the PID is alive and still runs NAME
  kill -0 "$2" 2>/dev/null && grep -qa "$1" "/proc/$2/cmdline" 2>/dev/null
}

# cancel the jobs first, so that no job script outlives its slurmd
if [ -f "$STATE_DIR/slurm.conf" ]; then
  export SLURM_CONF=$STATE_DIR/slurm.conf
  ctld=$(awk '$1 == "slurmctld" {print $2}' "$PIDS")
  if [ -n "$ctld" ] && ours slurmctld "$ctld"; then
    jobs=$(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ')
    if [ -n "${jobs// /}" ]; then
      # shellcheck disable=SC2086
      timeout 10 scancel $jobs 2>/dev/null || true
      for _ in $(seq 1 50); do
        [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.2
      done
    fi
  fi
fi

mapfile -t entries < <(tac "$PIDS")
for entry in "${entries[@]}"; do
  read -r name pid <<< "$entry"
  [ -n "${pid:-}" ] || continue
  ours "$name" "$pid" || continue
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    ours "$name" "$pid" || break
    sleep 0.1
  done
  if ours "$name" "$pid"; then
    echo "testcluster: $name (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.2
  fi
done

left=""
for entry in "${entries[@]}"; do
  read -r name pid <<< "$entry"
  [ -n "${pid:-}" ] && ours "$name" "$pid" && left+=" $name($pid)"
done
[ -z "$left" ] || die "still running after SIGKILL:$left"
remove_net
rm -f "$PIDS" "$STATE_DIR/cluster.env"
echo "testcluster: stopped (logs in $STATE_DIR/log)"
