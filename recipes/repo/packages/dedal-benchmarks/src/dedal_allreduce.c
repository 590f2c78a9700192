/* MPI_Allreduce (sum of floats) average latency over all ranks, per message size. */
#include "common.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t max = max_size_from_args(argc, argv);
    if (max > (size_t)1 << 20) max = (size_t)1 << 20;
    float *in = buffer(max), *out = buffer(max);
    if (rank == 0) {
        printf("# dedal-bench MPI Allreduce Latency Test v" DEDAL_BENCH_VERSION "\n");
        printf("# Size       Avg Latency(us)\n");
    }
    /* One untimed pass over every size first, so that the first size measured does not
     * carry the start-up: lazy symbol binding, the first touch of pages of a freshly
     * mounted image, transport wire-up (dedal_init and the job's wall time measure those). */
    for (size_t s = 4; s <= max; s *= 2)
        MPI_Allreduce(in, out, (int)(s / sizeof(float)), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (size_t s = 4; s <= max; s *= 2) {
        int count = (int)(s / sizeof(float)), iters = iterations(s, 1000, 100), warm = iters / 10;
        double t0 = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < iters + warm; i++) {
            if (i == warm) t0 = now_us();
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        double local = (now_us() - t0) / iters, sum;
        MPI_Reduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("%-10zu %18.2f\n", s, sum / size);
        fflush(stdout);
    }
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
