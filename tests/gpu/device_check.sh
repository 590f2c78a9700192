#!/bin/bash
# The CUDA/NCCL parts of verification on a real GPU machine (the `device` tool; see
# tests/gpu/README.md): the bundled NCCL all-reduce benchmark compiled with the machine's
# nvcc against its NCCL, run with NCCL_DEBUG=INFO; the driver files the preflight reads.
# Everything it records goes to $OUT (default ./gpu-out).
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
SRC=recipes/repo/packages/dedal-benchmarks/src
{
  echo "## date"; date -u
  echo "## nvidia-smi"; nvidia-smi 2>&1
  echo "## nvcc"; nvcc --version 2>&1
  echo "## mpicc"; command -v mpicc mpirun 2>&1
} > "$OUT/machine.txt"
cp /proc/driver/nvidia/version "$OUT/proc_driver_nvidia_version.txt" 2>/dev/null
echo "## /proc/driver/nvidia/gpus" >> "$OUT/machine.txt"; ls /proc/driver/nvidia/gpus >> "$OUT/machine.txt" 2>&1
# NCCL: the system's, else the one pip's nvidia-nccl wheel puts beside PyTorch
NCCL_INC= NCCL_LIB=
for d in /usr/include /usr/local/include /usr/local/cuda/include; do [ -f $d/nccl.h ] && NCCL_INC=$d && break; done
if [ -z "$NCCL_INC" ]; then
  P=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  [ -n "$P" ] && NCCL_INC=$P/include && NCCL_LIB=$P/lib
fi
[ -z "$NCCL_LIB" ] && NCCL_LIB=$(dirname "$(ldconfig -p | awk '/libnccl.so/ {print $NF; exit}')" 2>/dev/null)
echo "nccl include $NCCL_INC lib $NCCL_LIB" >> "$OUT/machine.txt"
ls "$NCCL_LIB" >> "$OUT/machine.txt" 2>&1
[ -f "$NCCL_LIB/libnccl.so" ] || ln -sf "$(ls "$NCCL_LIB"/libnccl.so.* | head -1)" /tmp/libnccl.so && NCCL_LINK=/tmp
command -v mpicc >/dev/null || { echo "device_check.sh: needs an MPI (mpicc, mpirun) on the GPU machine" >&2; exit 2; }
MPI_FLAGS=$(mpicc --showme:compile 2>/dev/null); MPI_LIBS=$(mpicc --showme:link 2>/dev/null)
nvcc -O2 -o /tmp/dedal_nccl_allreduce $SRC/dedal_nccl_allreduce.cu $MPI_FLAGS -I"$NCCL_INC" \
  -L"${NCCL_LINK:-$NCCL_LIB}" -L"$NCCL_LIB" -lnccl -Xlinker -rpath="$NCCL_LIB" $MPI_LIBS > "$OUT/compile.log" 2>&1
echo "compile rc=$?" >> "$OUT/compile.log"
export NCCL_DEBUG=INFO
/tmp/dedal_nccl_allreduce $((1 << 28)) > "$OUT/nccl_allreduce_1rank.log" 2>&1
echo "#@ exit $?" >> "$OUT/nccl_allreduce_1rank.log"
# two ranks on one GPU: NCCL refuses a communicator with the same GPU twice
RUN="mpirun --allow-run-as-root --oversubscribe -np 2"
$RUN -x NCCL_DEBUG /tmp/dedal_nccl_allreduce $((1 << 20)) > "$OUT/nccl_allreduce_2ranks_1gpu.log" 2>&1
echo "#@ exit $?" >> "$OUT/nccl_allreduce_2ranks_1gpu.log"
# the host's MPI stack as the verify runner runs it: UCX and Open MPI debug output on
{ echo "## ompi_info"; ompi_info --version 2>&1 | head -3; ompi_info 2>&1 | grep -i -E "pml|btl|pmix" | head -20
  echo "## ucx_info -v"; ucx_info -v 2>&1; } >> "$OUT/machine.txt"
command -v ucx_info >/dev/null && ucx_info -d > "$OUT/ucx_info_d.txt" 2>&1
for b in dedal_latency dedal_bw; do
  mpicc -O2 -std=c11 -I$SRC -o /tmp/$b $SRC/$b.c >> "$OUT/compile.log" 2>&1
done
env UCX_LOG_LEVEL=info UCX_PROTO_INFO=y $RUN -x UCX_LOG_LEVEL -x UCX_PROTO_INFO --mca pml ucx \
  --mca pml_base_verbose 10 /tmp/dedal_latency -m 65536 > "$OUT/latency_ucx.log" 2>&1
echo "#@ exit $?" >> "$OUT/latency_ucx.log"
# pml ucx on any transport (as dedal's runner asks where no RDMA device is), then TCP forced
UCXANY="--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any --mca pml_base_verbose 10"
env UCX_LOG_LEVEL=info UCX_PROTO_INFO=y $RUN -x UCX_LOG_LEVEL -x UCX_PROTO_INFO $UCXANY \
  /tmp/dedal_latency -m 65536 > "$OUT/latency_ucx_any.log" 2>&1
echo "#@ exit $?" >> "$OUT/latency_ucx_any.log"
env UCX_LOG_LEVEL=info UCX_PROTO_INFO=y UCX_TLS=tcp $RUN -x UCX_LOG_LEVEL -x UCX_PROTO_INFO -x UCX_TLS $UCXANY \
  /tmp/dedal_latency -m 65536 > "$OUT/latency_ucx_tcp.log" 2>&1
echo "#@ exit $?" >> "$OUT/latency_ucx_tcp.log"
ls -la "$OUT"
tail -5 "$OUT/compile.log"; tail -8 "$OUT/nccl_allreduce_1rank.log"; tail -n 15 "$OUT"/latency_ucx_any.log "$OUT"/latency_ucx_tcp.log
