#!/bin/bash
# esd-cpu (or ENV) through `dedal build` with the Slurm executor on 1, then 3, nodes of the
# namespaced test cluster, a fresh data directory each (fetch first, untimed), one after the
# other. Needs root and a real Spack (DEDAL_SPACK_ROOT). SHARED: a directory the nodes see
# (default /work). Writes OUT/nodes-*.{json,txt} and OUT/nodes-result.txt; nodes.md was
# written from them.
#   sudo DEDAL_SPACK_ROOT=/path/to/spack benchmarks/mpi_offline/nodes.sh [ENV] [OUT]
set -u
cd "$(dirname "$0")/../.." || exit 1
ENV=${1:-spack-envs/esd-cpu/env.yaml}
OUT=${2:-/tmp/dedal-nodes}
SHARED=${SHARED:-/work}
mkdir -p "$OUT"
TC=$(mktemp -d /tmp/tc-nodes.XXXX)
DEDAL_TC_NETNS=1 DEDAL_TC_SHARED="$SHARED" slurm/testcluster/start.sh "$TC" 3 > "$OUT/cluster.log" 2>&1 \
  || { echo "test cluster did not start: $OUT/cluster.log" >&2; exit 1; }
trap 'slurm/testcluster/stop.sh "$TC" >> "$OUT/cluster.log" 2>&1' EXIT
for n in 1 3; do
  d="$SHARED/dedal-nodes-data-$n"; rm -rf "$d"
  export DEDAL_DATA_DIR="$d" SLURM_CONF="$TC/slurm.conf" DEDAL_EXECUTOR=slurm DEDAL_SLURM_NODES=$n \
         DEDAL_STAGE_DIR=/dev/shm/dedal-nodes DEDAL_SLURM_POLL_S=1 DEDAL_SLURM_TIME_FACTOR=0
  .venv/bin/dedal fetch "$ENV" --json > "$OUT/nodes-fetch-$n.json" || exit 1
  .venv/bin/dedal plan "$ENV" --simulate --nodes $n --cores 2 > "$OUT/nodes-sim-$n.txt" 2>&1
  s=$(date +%s.%N)
  .venv/bin/dedal build "$ENV" --json > "$OUT/nodes-build-$n.json" 2> "$OUT/nodes-build-$n.err"
  rc=$?
  e=$(date +%s.%N)
  echo "nodes=$n rc=$rc wall=$(echo "$e - $s" | bc) load=$(cat /proc/loadavg)" >> "$OUT/nodes-result.txt"
  name=$(basename "$(dirname "$ENV")")
  cp "$d/work/$name/slurm-jobs.json" "$OUT/nodes-jobs-$n.json"
  rm -rf "$d"
done
