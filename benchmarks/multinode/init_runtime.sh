#!/bin/bash
# MPI_Init in an image, by container runtime: `dedal verify -b init` with srun on one node of
# the namespaced test cluster, Apptainer (each rank runs `apptainer exec IMAGE`, which mounts
# the SIF for that rank) against bubblewrap (every rank over the one mount dedal made),
# alternating, ROUNDS times each; the native side is the image's root filesystem unpacked, the
# same in both. Needs root, Apptainer on PATH (APPTAINER_DROP_CAPS=CAP_SYS_RESOURCE as root),
# and SHARED: a directory the nodes see, holding the image (the reports go there too).
# Prints one markdown row per run: runtime, native and container medians (ms), verdict.
#   sudo SHARED=/work benchmarks/multinode/init_runtime.sh IMAGE.sif [ROUNDS] [REPETITIONS]
set -u
cd "$(dirname "$0")/../.." || exit 1
SIF=$(realpath "${1:?usage: init_runtime.sh IMAGE.sif [ROUNDS] [REPETITIONS]}")
ROUNDS=${2:-2}
REPS=${3:-5}
SHARED=${SHARED:-/work}
OUT=$(mktemp -d "$SHARED/dedal-init-runtime.XXXX")
TC=$(mktemp -d /tmp/tc-init.XXXX)
DEDAL_TC_NETNS=1 DEDAL_TC_SHARED="$SHARED:$(dirname "$SIF")" slurm/testcluster/start.sh "$TC" 1 > "$OUT/cluster.log" 2>&1 \
  || { echo "test cluster did not start: $OUT/cluster.log" >&2; exit 1; }
trap 'slurm/testcluster/stop.sh "$TC" >> "$OUT/cluster.log" 2>&1' EXIT
echo "| round | runtime | native median (ms) | container median (ms) | container / native | verdict | load before |"
echo "|---|---|---|---|---|---|---|"
for round in $(seq 1 "$ROUNDS"); do
  for rt in apptainer bwrap; do
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    SLURM_CONF="$TC/slurm.conf" .venv/bin/dedal verify run "$SIF" --launcher srun --nodes 1 -b init -r "$REPS" \
      --runtime "$rt" --output "$OUT/$rt-$round" --json > /dev/null 2>> "$OUT/verify.err"
    .venv/bin/python - "$OUT/$rt-$round/verify.json" "$round" "$rt" "$load" <<'PY'
import json, sys
path, rnd, rt, load = sys.argv[1:]
check = next(c for c in json.load(open(path))["checks"] if c["name"] == "dedal_init intra-node")
size = check["sizes"][0]
n, c = size["native"]["median"], size["container"]["median"]
print(f"| {rnd} | {rt} | {n:.1f} | {c:.1f} | {c / n:.2f} | {check['verdict']} | {load} |")
PY
  done
done
echo "reports: $OUT"
