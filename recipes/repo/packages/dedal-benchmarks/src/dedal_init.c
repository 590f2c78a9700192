/* MPI_Init time per rank (wall clock around MPI_Init), reduced to min/max/avg. */
#include "common.h"

int main(int argc, char **argv) {
    double t0 = now_us();
    MPI_Init(&argc, &argv);
    double ms = (now_us() - t0) / 1000.0;
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double mn, mx, sum;
    MPI_Reduce(&ms, &mn, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(&ms, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&ms, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("# dedal-bench MPI Init Test v" DEDAL_BENCH_VERSION "\n");
        printf("nprocs: %d, min: %.0f ms, max: %.0f ms, avg: %.0f ms\n", size, mn, mx, sum / size);
        printf("# precise: min %.3f ms, max %.3f ms, avg %.3f ms\n", mn, mx, sum / size);
    }
    MPI_Finalize();
    return 0;
}
