/* Point-to-point ping-pong latency between rank 0 and rank 1 (half round trip). */
#include "cuda_driver.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    need_two_ranks(size, "dedal_latency");
    size_t max = max_size_from_args(argc, argv);
    char *buf = bench_buffer(max, rank, argc, argv);  /* -d cuda: on the GPU (CUDA-aware MPI) */
    if (rank == 0) {
        printf(on_device(argc, argv) ? "# dedal-bench MPI-CUDA Latency Test v" DEDAL_BENCH_VERSION "\n"
                                     : "# dedal-bench MPI Latency Test v" DEDAL_BENCH_VERSION "\n");
        printf("# Size          Latency (us)\n");
    }
    /* One untimed pass over every size first, so that the first size measured does not
     * carry the start-up: lazy symbol binding, the first touch of pages of a freshly
     * mounted image, transport wire-up (dedal_init and the job's wall time measure those). */
    for (size_t s = 0; s <= max; s = s ? s * 2 : 1) {
        if (rank == 0) {
            MPI_Send(buf, (int)s, MPI_CHAR, 1, 2, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)s, MPI_CHAR, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, (int)s, MPI_CHAR, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)s, MPI_CHAR, 0, 2, MPI_COMM_WORLD);
        }
    }
    for (size_t s = 0; s <= max; s = s ? s * 2 : 1) {
        int iters = iterations(s, 1000, 100), warm = iters / 10;
        double t0 = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < iters + warm; i++) {
            if (i == warm) t0 = now_us();
            if (rank == 0) {
                MPI_Send(buf, (int)s, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
                MPI_Recv(buf, (int)s, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buf, (int)s, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, (int)s, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
            }
        }
        if (rank == 0) printf("%-10zu %18.2f\n", s, (now_us() - t0) / (2.0 * iters));
        fflush(stdout);
    }
    if (!on_device(argc, argv)) free(buf);
    MPI_Finalize();
    return 0;
}
