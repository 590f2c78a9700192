#!/usr/bin/env bash
# Run one test-cluster node's slurmd as a separate node: called by start.sh (netns mode) as
#
#   nsenter --net=/run/netns/NETNS unshare --mount --uts --propagation private -- node-ns.sh NODE -- CMD...
#
# Inside its own network namespace (start.sh gave it a veth on the cluster's bridge) and
# its own mount and UTS namespaces, it gives the node what a real compute node has of its
# own: hostname NODE, and private /dev/shm, /tmp and /run (tmpfs), so that Slurm's PMIx
# plugin, PRRTE, UCX and dedal's stages see nothing of the other nodes. Each SHARED path
# (the state directory, the layer store, the mirror: what a parallel file system holds) stays
# the host's own, also where it lies under /tmp. Then it becomes slurmd (exec, same PID, so
# stop.sh stops it by the PID start.sh recorded). Its processes, and so its tmpfs, go when
# the node stops: a node killed takes its stage with it.
set -euo pipefail

NODE=${1:?usage: node-ns.sh NODE -- CMD...}
[ "${2:-}" = "--" ] && [ $# -ge 3 ] || { echo "usage: node-ns.sh NODE -- CMD..." >&2; exit 2; }
shift 2
IFS=: read -r -a SHARED <<< "${DEDAL_TC_SHARED:-}"
for path in "${SHARED[@]}"; do
  case $path in
    /run/*) echo "node-ns: shared path $path under /run is not supported" >&2; exit 1 ;;
  esac
done

hostname "$NODE"
# the cluster's own names (start.sh writes STATE_DIR/hosts): nodes find each other by name
[ -z "${DEDAL_TC_HOSTS:-}" ] || mount --bind "$DEDAL_TC_HOSTS" /etc/hosts
# /dev/shm first: it holds the host's /tmp for a moment, to bind the shared paths back
mount -t tmpfs -o mode=1777,size=50% "tmpfs-$NODE-shm" /dev/shm
HOSTTMP=/dev/shm/.host-tmp
mkdir -p "$HOSTTMP"
mount --bind /tmp "$HOSTTMP"
mount -t tmpfs -o mode=1777 "tmpfs-$NODE-tmp" /tmp
for path in "${SHARED[@]}"; do
  case $path in
    /tmp/*)
      rel=${path#/tmp/}
      [ -e "$HOSTTMP/$rel" ] || { echo "node-ns: shared path $path does not exist" >&2; exit 1; }
      if [ -d "$HOSTTMP/$rel" ]; then mkdir -p "$path"; else mkdir -p "$(dirname "$path")"; : > "$path"; fi
      mount --bind "$HOSTTMP/$rel" "$path" ;;
  esac
done
umount "$HOSTTMP"
rmdir "$HOSTTMP"
# /run: a private one, with the directories daemons expect
mount -t tmpfs -o mode=755 "tmpfs-$NODE-run" /run
mkdir -p /run/lock /run/user && chmod 1777 /run/lock
exec "$@"
