/* NCCL all-reduce bus bandwidth, one GPU per MPI rank (MPI only bootstraps NCCL).
 * Output follows nccl-tests' all_reduce_perf table so the same parser reads it:
 * size count type redop root | out-of-place time algbw busbw #wrong | in-place ... and
 * "# Avg bus bandwidth". busbw = algbw * 2 (n - 1) / n, as in nccl-tests. */
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define CUDACHECK(cmd) do { cudaError_t e = cmd; if (e != cudaSuccess) { \
    fprintf(stderr, "dedal_nccl_allreduce: CUDA error %s:%d '%s'\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
    MPI_Abort(MPI_COMM_WORLD, 3); } } while (0)
#define NCCLCHECK(cmd) do { ncclResult_t r = cmd; if (r != ncclSuccess) { \
    fprintf(stderr, "dedal_nccl_allreduce: NCCL error %s:%d '%s'\n", __FILE__, __LINE__, ncclGetErrorString(r)); \
    MPI_Abort(MPI_COMM_WORLD, 4); } } while (0)

static double run(ncclComm_t comm, cudaStream_t stream, float *send, float *recv, size_t count, int iters) {
    for (int i = 0; i < 5; i++) NCCLCHECK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream));
    CUDACHECK(cudaStreamSynchronize(stream));
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) NCCLCHECK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream));
    CUDACHECK(cudaStreamSynchronize(stream));
    double us = (MPI_Wtime() - t0) * 1e6 / iters, max_us;
    MPI_Allreduce(&us, &max_us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return max_us;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, nranks, ndev;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    CUDACHECK(cudaGetDeviceCount(&ndev));
    MPI_Comm local;
    int lrank;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &lrank);
    CUDACHECK(cudaSetDevice(lrank % ndev));
    ncclUniqueId id;
    if (rank == 0) NCCLCHECK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
    size_t maxbytes = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)1 << 30;
    float *send, *recv;
    cudaStream_t stream;
    CUDACHECK(cudaMalloc(&send, maxbytes));
    CUDACHECK(cudaMalloc(&recv, maxbytes));
    CUDACHECK(cudaStreamCreate(&stream));
    double factor = 2.0 * (nranks - 1) / nranks, sum_bw = 0;
    int rows = 0;
    if (rank == 0) {
        char host[256];
        gethostname(host, sizeof host);
        printf("# dedal-bench NCCL all-reduce v1.0: nranks %d, host %s, nccl %d.%d.%d\n", nranks, host,
               NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
        printf("#                                                              out-of-place                       in-place          \n");
        printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
        printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n");
    }
    for (size_t bytes = 8; bytes <= maxbytes; bytes *= 2) {
        size_t count = bytes / sizeof(float);
        int iters = bytes > (1 << 24) ? 20 : 100;
        double oop = run(comm, stream, send, recv, count, iters);
        double ip = run(comm, stream, send, send, count, iters);
        double oop_alg = bytes / oop / 1e3, ip_alg = bytes / ip / 1e3;
        if (rank == 0)
            printf("%12zu  %12zu     float     sum      -1  %7.2f  %6.2f  %6.2f      0  %7.2f  %6.2f  %6.2f      0\n",
                   bytes, count, oop, oop_alg, oop_alg * factor, ip, ip_alg, ip_alg * factor);
        sum_bw += (oop_alg + ip_alg) * factor / 2;
        rows++;
    }
    if (rank == 0) {
        printf("# Out of bounds values : 0 OK\n");
        printf("# Avg bus bandwidth    : %g \n#\n", rows ? sum_bw / rows : 0.0);
    }
    ncclCommDestroy(comm);
    MPI_Finalize();
    return 0;
}
