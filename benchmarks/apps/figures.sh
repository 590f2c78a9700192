#!/bin/bash
# Every scaling figure of benchmarks/apps/ in one command: NEURON's ringtest and Arbor's
# busyring from esd-neuro, strong and weak scaling at 1, 2 and 3 nodes (one rank per node),
# native and container side by side, once with Apptainer (the ranks of a node joining one
# instance) and once with bubblewrap (over the one mount dedal makes), each by
# benchmarks/apps/scaling.py (one `dedal verify -b apps` per node count). Results go to
# benchmarks/apps/results/<app>-<mode>-<runtime>/ (results.md, results.json, the plot, each node
# count's report), and one table of them all in benchmarks/apps/results/summary.md (summary.py).
# With no Slurm allocation it starts the namespaced test cluster of 3 nodes itself (needs
# root; SHARED: colon-separated directories under /tmp that the nodes must see, as every node
# has a /tmp of its own) and stops it at the end; inside an allocation of 3 nodes it uses that.
#   sudo benchmarks/apps/figures.sh IMAGE.sif [REPETITIONS]     (default 5)
#   FIGURES="ringtest-strong busyring-weak" ... to run only some of them
set -u
cd "$(dirname "$0")/../.." || exit 1
SIF=$(realpath "${1:?usage: figures.sh IMAGE.sif [REPETITIONS]}")
REPS=${2:-5}
ENV_FILE=spack-envs/esd-neuro/env.yaml
FIGURES=${FIGURES:-ringtest-strong ringtest-weak busyring-strong busyring-weak}
RUNTIMES=${RUNTIMES:-apptainer bwrap}
OUT=benchmarks/apps/results
mkdir -p "$OUT"

if [ -z "${SLURM_JOB_ID:-}" ]; then
  TC=$(mktemp -d /tmp/tc-apps.XXXX)
  DEDAL_TC_NETNS=1 DEDAL_TC_SHARED="${SHARED:-}" slurm/testcluster/start.sh "$TC" 3 > "$OUT/cluster.log" 2>&1 \
    || { echo "test cluster did not start: $OUT/cluster.log" >&2; exit 1; }
  trap 'slurm/testcluster/stop.sh "$TC" >> "$OUT/cluster.log" 2>&1' EXIT
  export SLURM_CONF=$TC/slurm.conf
  exec_in=(salloc -N3 --exclusive --quiet)
else
  exec_in=()
fi

# the problem of each figure: strong scaling keeps it (ringtest's default 16 rings of 8 cells,
# checked against the spikes the repository ships; busyring's 6 cells, divisible by 1, 2 and
# 3 ranks, each rank on one CPU); weak scaling grows it with the ranks (16 rings, 2 cells per rank), the spike
# count then the same natively and in the container at each size
args_of() {
  case $1 in
    ringtest-strong) echo "--app ringtest --mode strong --reference-output spk{ranks}.std" ;;
    ringtest-weak) echo "--app ringtest --mode weak" ;;
    busyring-strong) echo "--app busyring --mode strong" ;;
    busyring-weak) echo "--app busyring --mode weak" ;;
    *) echo "unknown figure $1" >&2; return 1 ;;
  esac
}
# busyring runs a thread per CPU it may use: every rank is bound to one CPU (as srun
# --cpu-bind=cores gives each rank its own core on a cluster), else one rank already fills
# the machine and more ranks only share it
BIND='taskset -c $((PMIX_RANK % $(nproc)))'
command_of() {
  case $1 in
    ringtest-weak) echo 'ringtest -nring $((16 * {ranks})) -tstop 100' ;;
    busyring-strong) echo "busyring-input 6 10 > ring-\$PMIX_RANK.json && $BIND busyring ring-\$PMIX_RANK.json" ;;
    busyring-weak) echo "busyring-input \$((2 * {ranks})) 10 > ring-\$PMIX_RANK.json && $BIND busyring ring-\$PMIX_RANK.json" ;;
  esac
}
expect_of() {
  case $1 in
    ringtest-weak) echo 'wrote (?P<value>[0-9]+) spikes' ;;
  esac
}

status=0
for fig in $FIGURES; do
  read -r -a args <<< "$(args_of "$fig")" || exit 2
  cmd=$(command_of "$fig")
  expect=$(expect_of "$fig")
  for rt in $RUNTIMES; do
    dir=$OUT/$fig-$rt
    echo "== $fig ($rt) -> $dir/results.md" >&2
    "${exec_in[@]}" .venv/bin/python benchmarks/apps/scaling.py "$SIF" --env-file "$ENV_FILE" "${args[@]}" \
      --nodes 1,2,3 --ranks-per-node 1 -r "$REPS" -o "$dir" ${cmd:+--command "$cmd"} ${expect:+--expect "$expect"} \
      -- --runtime "$rt" > "$dir.log" 2>&1 || { echo "   not all good: $dir.log" >&2; status=1; }
  done
done
.venv/bin/python benchmarks/apps/summary.py "$OUT" > /dev/null || status=1
exit $status
