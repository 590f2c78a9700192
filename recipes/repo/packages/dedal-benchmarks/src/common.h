/* dedal-benchmarks: shared helpers. Output follows the layout of the OSU
 * Micro-Benchmarks (a header line, a column line starting with "# Size", then one row
 * per message size) so that the same parser reads both. */
#ifndef DEDAL_BENCH_COMMON_H
#define DEDAL_BENCH_COMMON_H

#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEDAL_BENCH_VERSION "1.1"
#define MAX_SIZE_DEFAULT (4 * 1024 * 1024)

static inline double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* iterations per size: many for small messages, fewer for large ones */
static inline int iterations(size_t size, int small, int large) {
    return size > 8192 ? large : small;
}

static inline size_t max_size_from_args(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "-m") == 0) return (size_t)strtoull(argv[i + 1], NULL, 10);
    return MAX_SIZE_DEFAULT;
}

static inline void *buffer(size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, size ? size : 1) != 0) {
        fprintf(stderr, "dedal-bench: cannot allocate %zu bytes\n", size);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    memset(p, 'a', size ? size : 1);
    return p;
}

static inline void need_two_ranks(int size, const char *name) {
    if (size != 2) {
        int rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (rank == 0) fprintf(stderr, "%s: needs exactly 2 ranks, got %d\n", name, size);
        MPI_Finalize();
        exit(1);
    }
}
#endif
