/* Uni-directional bandwidth rank 0 -> rank 1 with a window of non-blocking sends. */
#include "cuda_driver.h"

#define WINDOW 64

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    need_two_ranks(size, "dedal_bw");
    size_t max = max_size_from_args(argc, argv);
    char *buf = bench_buffer(max, rank, argc, argv);  /* -d cuda: on the GPU (CUDA-aware MPI) */
    char ack = 0;
    MPI_Request req[WINDOW];
    if (rank == 0) {
        printf(on_device(argc, argv) ? "# dedal-bench MPI-CUDA Bandwidth Test v" DEDAL_BENCH_VERSION "\n"
                                     : "# dedal-bench MPI Bandwidth Test v" DEDAL_BENCH_VERSION "\n");
        printf("# Size      Bandwidth (MB/s)\n");
    }
    /* One untimed pass over every size first, so that the first size measured does not
     * carry the start-up: lazy symbol binding, the first touch of pages of a freshly
     * mounted image, transport wire-up (dedal_init and the job's wall time measure those). */
    for (size_t s = 1; s <= max; s *= 2) {
        if (rank == 0) {
            for (int w = 0; w < WINDOW; w++) MPI_Isend(buf, (int)s, MPI_CHAR, 1, 102, MPI_COMM_WORLD, &req[w]);
            MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
            MPI_Recv(&ack, 1, MPI_CHAR, 1, 103, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (int w = 0; w < WINDOW; w++) MPI_Irecv(buf, (int)s, MPI_CHAR, 0, 102, MPI_COMM_WORLD, &req[w]);
            MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
            MPI_Send(&ack, 1, MPI_CHAR, 0, 103, MPI_COMM_WORLD);
        }
    }
    for (size_t s = 1; s <= max; s *= 2) {
        int iters = iterations(s, 100, 20), warm = 5;
        double t0 = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < iters + warm; i++) {
            if (i == warm) t0 = now_us();
            if (rank == 0) {
                for (int w = 0; w < WINDOW; w++) MPI_Isend(buf, (int)s, MPI_CHAR, 1, 100, MPI_COMM_WORLD, &req[w]);
                MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
                MPI_Recv(&ack, 1, MPI_CHAR, 1, 101, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                for (int w = 0; w < WINDOW; w++) MPI_Irecv(buf, (int)s, MPI_CHAR, 0, 100, MPI_COMM_WORLD, &req[w]);
                MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
                MPI_Send(&ack, 1, MPI_CHAR, 0, 101, MPI_COMM_WORLD);
            }
        }
        double us = now_us() - t0;
        if (rank == 0) printf("%-10zu %18.2f\n", s, (double)s * WINDOW * iters / us);  /* bytes/us = MB/s */
        fflush(stdout);
    }
    if (!on_device(argc, argv)) free(buf);
    MPI_Finalize();
    return 0;
}
