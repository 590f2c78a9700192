#!/bin/bash
# The GPU verification kit (benchmarks/gpu/README.md): `dedal verify` of a GPU image, GPU checks
# run, on a machine with a GPU and no network, from the bundle that make_bundle.py made here.
#
#   OUT=DIR bash benchmarks/gpu/kit.sh          (from the checkout's root; KIT=.gpu-kit by default)
#
# What it keeps is in $OUT, at most 8 files (what the device tool brings back):
#   kit.log      this script's output, every step with its time and what it found or did
#   host.txt     the machine: GPU, driver, clocks, topology, CPUs, gdrcopy, the kit's runtime and NCCL
#   verify.json  dedal verify's report: checks (GPU ones included), findings, measurements, provenance
#   report.md    the same for people
#   raw.tar.xz   every run's raw log (benchmark output with UCX, Open MPI and NCCL debug output)
#   floor.txt    (optional) dedal_cuda_floor up to 4 MiB: CUDA IPC ping-pong, copy + sync, copy bandwidth
#   ucx.txt      (optional) dedal_latency -d cuda under UCX settings (memory hooks, protocols, rendezvous
#                threshold, cuda_ipc cache, transports), each table after its command line
#   parse.txt    (optional) dedal verify parse of floor.txt and ucx.txt
# It runs for at most BUDGET seconds (default 540, under the device tool's 600 s per command); the
# optional steps run only while enough is left, each boxed in time.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$here/gpu-out}
KIT=${KIT:-$here/.gpu-kit}
BUDGET=${BUDGET:-540}
W=${KIT_WORK:-/tmp/dedal-kit}
PY=${KIT_PYTHON:-python3}        # a Python 3.9+ with PyYAML, rich and requests (the device image's has them)
start=$(date +%s)
mkdir -p "$OUT"
exec > >(tee -a "$OUT/kit.log") 2>&1
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
say() { echo "== [$(( $(date +%s) - start ))s] $*"; }
stop() { say "STOP: $*"; exit 2; }

say "kit: $KIT, work: $W, out: $OUT, budget ${BUDGET}s"
[ -f "$KIT/root.tar.xz" ] || stop "no bundle: $KIT/root.tar.xz (make it with benchmarks/gpu/make_bundle.py)"
rm -rf "$W" && mkdir -p "$W/bin" "$W/image"

# ---- the machine ------------------------------------------------------------------------------
{
  echo "## date"; date -u
  echo "## uname"; uname -a
  echo "## nvidia-smi"; nvidia-smi 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total,pstate,clocks.sm,clocks.max.sm,clocks.mem --format=csv 2>&1
  echo "## topology"; nvidia-smi topo -m 2>&1
  echo "## /proc/driver/nvidia/version"; cat /proc/driver/nvidia/version 2>&1
  echo "## gdrcopy (/dev/gdrdrv)"; ls -la /dev/gdrdrv 2>&1
  echo "## cpus"; nproc; grep -m1 "model name" /proc/cpuinfo
  echo "## python"; command -v python3; python3 --version
  echo "## runtimes"; command -v apptainer bwrap 2>&1
  echo "## bundle"; cat "$KIT/manifest.json" 2>&1
} > "$OUT/host.txt" 2>&1
say "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"

# ---- dedal and what it needs --------------------------------------------------------------------
src=$here
[ -f "$src/dedal/__init__.py" ] || { mkdir -p "$W/dedal-src" && tar -xzf "$KIT/dedal.tar.gz" -C "$W/dedal-src" \
  && src=$W/dedal-src; }
$PY -c "import yaml, rich, requests" 2>/dev/null || stop "$PY lacks dedal's PyYAML, rich or requests"
cat > "$W/bin/dedal" <<EOF
#!/bin/sh
exec $PY -c 'import sys; sys.path.insert(0, "$src"); from dedal.cli import main; sys.exit(main(sys.argv[1:]))' "\$@"
EOF
chmod +x "$W/bin/dedal"
export PATH=$W/bin:$PATH
if [ -n "${KIT_OWN_RUNTIME:-}" ] || { ! command -v apptainer >/dev/null && ! command -v bwrap >/dev/null; }; then
  export PATH=$KIT/runtime:$PATH
  say "runtime: the kit's bubblewrap ($KIT/runtime/bwrap)"
fi
bwrap --ro-bind / / true 2>>"$OUT/host.txt" || say "bwrap cannot make a sandbox here (see host.txt)"
dedal --version 2>&1 | head -1

# the host driver's libraries in the ld cache, where dedal (as apptainer --nv) finds them
if ! ldconfig -p | grep -q "libcuda.so.1 "; then
  lib=$(find /usr/local/nvidia /usr/lib64 /usr/lib/x86_64-linux-gnu /usr/lib -name libcuda.so.1 2>/dev/null | head -1)
  if [ -n "$lib" ]; then
    echo "$(dirname "$lib")" > /etc/ld.so.conf.d/zz-dedal-kit-nvidia.conf && ldconfig
    say "driver: $(dirname "$lib") added to the ld cache"
  else
    say "driver: no libcuda.so.1 on this machine: the GPU checks will be skipped"
  fi
fi

# ---- the image ----------------------------------------------------------------------------------
if command -v xz >/dev/null; then tar -xJf "$KIT/root.tar.xz" -C "$W/image"
else $PY -c "import lzma, tarfile, sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" \
  "$KIT/root.tar.xz" "$W/image"; fi || stop "cannot unpack $KIT/root.tar.xz"
say "image: $(du -sh "$W/image" | cut -f1) unpacked; $($PY -c "import json; print(json.load(open('$W/image/.dedal-kit.json')).get('built_note', ''))")"
# what the bundle left out for size (NCCL: 241 MB for every GPU architecture): the host's library of that name
$PY - "$W/image" >> "$OUT/host.txt" 2>&1 <<'EOF'
import glob, json, os, shutil, subprocess, sys
root = sys.argv[1]
kit = json.load(open(os.path.join(root, ".dedal-kit.json")))
for path, size in kit.get("left_out", {}).items():
    name = os.path.basename(path)
    stem = name.split(".so")[0] + ".so"
    cands = []
    try:
        import nvidia.nccl as n  # the NCCL of PyTorch's wheels
        cands += glob.glob(os.path.join(list(n.__path__)[0], "lib", stem + "*"))
    except ImportError:
        pass
    ld = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    cands += [l.split("=>")[-1].strip() for l in ld.splitlines() if l.strip().startswith(stem)]
    cands = [c for c in cands if os.path.isfile(c)]
    if not cands:
        print(f"## left out: {path} ({size >> 20} MiB): the host has no {stem}*: what needs it fails")
        continue
    shutil.copy(os.path.realpath(cands[0]), root + path)
    print(f"## left out: {path} ({size >> 20} MiB): the host's {os.path.realpath(cands[0])} stands in for it")
EOF
grep "^## left out" "$OUT/host.txt" | sed 's/^## /== /'

# ---- dedal verify, GPU checks included --------------------------------------------------------------
# and the GPU application benchmark of esd-gpu's env file (busyring-gpu, the container paper's Arbor
# ring on the GPU) where the image has busyring: one machine, so mpirun on 1 node over the env's srun
benchmarks=init,latency,bw,allreduce,nccl,osu
apps=()
# (found below /opt: the image's /opt/view is an absolute link, which resolves only inside it); only
# with a driver: the env file asks for the GPU, and verify refuses that on a machine without one
if ldconfig -p | grep -q "libcuda.so.1 " && [ -n "$(find "$W/image/opt" -path '*/bin/busyring' -print -quit 2>/dev/null)" ]; then
  benchmarks=$benchmarks,apps
  apps=(--env-file "$here/spack-envs/esd-gpu/env.yaml" --launcher mpirun --nodes 1)
  say "apps: busyring-gpu of spack-envs/esd-gpu/env.yaml"
fi
box=$(( $(left) - 200 )); [ $box -gt 420 ] && box=420
say "dedal verify (at most ${box}s)"
timeout $box dedal verify "$W/image" -o "$W/report" -b $benchmarks -r 2 ${apps[@]+"${apps[@]}"} \
  --max-size 4194304 --timeout 90 --runtime bwrap > "$W/verify.out" 2>&1
rc=$?
tail -40 "$W/verify.out"
say "dedal verify: exit $rc"
cp "$W/report/verify.json" "$W/report/report.md" "$OUT/" 2>/dev/null || say "no report (exit $rc)"

# ---- optional: the floor up to 4 MiB, natively (the image's root, the host driver) ---------------
NV="dedal exec --nv --no-cwd --runtime bwrap $W/image --"
if [ "$(left)" -gt 90 ]; then
  say "floor: dedal_cuda_floor -m 4194304"
  { echo "== mpirun -np 2 dedal_cuda_floor -m 4194304"
    timeout 60 $NV mpirun -np 2 --oversubscribe dedal_cuda_floor -m 4194304; echo "-- exit $?"; } > "$OUT/floor.txt" 2>&1
  grep -E "^(# GPU|1 |8 |64 |4194304 )" "$OUT/floor.txt" | head -8
fi

# ---- optional: UCX settings (issue 36, item 4), each one run of dedal_latency -d cuda ---------------
if [ "$(left)" -gt 60 ]; then
  for setting in "" UCX_MEM_EVENTS=no UCX_MEMTYPE_CACHE=n UCX_PROTO_ENABLE=y UCX_PROTO_ENABLE=n \
      UCX_RNDV_THRESH=0 UCX_RNDV_THRESH=inf UCX_CUDA_IPC_CACHE=n UCX_TLS=sm,self,cuda_copy,cuda_ipc \
      UCX_TLS=sm,self,cuda_copy UCX_ZCOPY_THRESH=0; do
    [ "$(left)" -gt 45 ] || { say "ucx: out of time before '$setting'"; break; }
    name=${setting%%=*}
    xs="-x UCX_LOG_LEVEL"; [ -n "$setting" ] && xs="$xs -x $name"
    # as dedal verify runs it: pml ucx on any transport (Open MPI 5's pml_ucx_tls lists only rc, ud, dc
    # and cuda_ipc/rocm_ipc by default: without one of those the UCX pml declines to open)
    { echo "== ${setting:-default}: mpirun -np 2 dedal_latency -d cuda -m 65536"
      timeout 40 $NV env UCX_LOG_LEVEL=info $setting mpirun -np 2 --oversubscribe $xs --mca pml ucx \
        --mca pml_ucx_tls any --mca pml_ucx_devices any dedal_latency -d cuda -m 65536 | tr -d '\000'
      echo "-- exit ${PIPESTATUS[0]}"; } >> "$OUT/ucx.txt" 2>&1
    say "ucx ${setting:-default}: 8 B $(grep -a -A60 "^== ${setting:-default}:" "$OUT/ucx.txt" | awk '$1 == 8 && NF == 2 {print $2 " us"; exit}')"
  done
fi
for f in floor.txt ucx.txt; do
  [ -f "$OUT/$f" ] && dedal verify parse "$OUT/$f" >> "$OUT/parse.txt" 2>&1
done

# ---- the raw logs ----------------------------------------------------------------------------------
cp "$W/verify.out" "$W/report/" 2>/dev/null
[ -d "$W/report" ] && tar -C "$W/report" -cJf "$OUT/raw.tar.xz" raw verify.out 2>/dev/null
ls -la "$OUT"
say "done"
