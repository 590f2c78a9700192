/* The platform's own floor for messages between GPU buffers, which no MPI stack can beat:
 * what dedal holds the device-buffer latency and bandwidth of OSU and dedal-bench (-d cuda) to.
 *
 *   IPC Latency   two ranks on one node ping-pong through CUDA IPC: each copies the message
 *                 into the other's GPU buffer (its cudaIpc handle opened once), synchronizes
 *                 its stream and tells the other with a zero-byte host message (half round trip);
 *   D2H+sync      one device-to-host copy into pinned memory and a stream synchronize;
 *   D2D+sync      one device-to-device copy within the GPU and a stream synchronize;
 *   Copy Bandwidth  64 copies in flight into the peer's GPU buffer, one synchronize.
 *
 * Plain C against the CUDA driver API, found at run time (cuda_driver.h): it builds with the
 * image's mpicc alone, no CUDA toolkit, and runs with whatever driver the host has. Two ranks;
 * rank r uses GPU r % n.
 * Output in the OSU layout (dedal's parser reads it): a "CUDA Floor Test" table and a
 * "CUDA Copy Bandwidth Test" table. A step that fails prints "-" in its column and says why. */
#include "cuda_driver.h"

#define WINDOW 64

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    need_two_ranks(nranks, "dedal_cuda_floor");
    const char *why = load();
    if (why) {
        if (rank == 0) fprintf(stderr, "dedal_cuda_floor: no CUDA driver: %s\n", why);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    size_t max = max_size_from_args(argc, argv);
    int ndev = 0, version = 0, major = 0, minor = 0;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    MUST(cu.Init(0));
    MUST(cu.DriverGetVersion(&version));
    MUST(cu.DeviceGetCount(&ndev));
    if (ndev < 1) {
        if (rank == 0) fprintf(stderr, "dedal_cuda_floor: no CUDA device\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MUST(cu.DeviceGet(&dev, rank % ndev));
    MUST(cu.DevicePrimaryCtxRetain(&ctx, dev));
    MUST(cu.CtxSetCurrent(ctx));
    MUST(cu.StreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */));
    char name[256] = "?";
    cu.DeviceGetName(name, sizeof name, dev);
    cu.DeviceGetAttribute(&major, CU_ATTR_CC_MAJOR, dev);
    cu.DeviceGetAttribute(&minor, CU_ATTR_CC_MINOR, dev);
    size_t bytes = (max ? max : 1) * WINDOW;
    CUdeviceptr mine, scratch, peer = 0;
    void *host;
    MUST(cu.MemAlloc(&mine, bytes));
    MUST(cu.MemAlloc(&scratch, max ? max : 1));
    MUST(cu.MemsetD8(mine, 'a', bytes));
    MUST(cu.MemHostAlloc(&host, max ? max : 1, 0));
    /* the peer's buffer, opened once: ranks exchange their IPC handles over MPI */
    CUipcMemHandle own, other;
    int ipc_ok = cu.IpcGetMemHandle(&own, mine) == 0, both = 0;
    MPI_Sendrecv(&own, sizeof own, MPI_BYTE, 1 - rank, 7, &other, sizeof other, MPI_BYTE, 1 - rank, 7,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    CUresult opened = ipc_ok ? cu.IpcOpenMemHandle(&peer, other, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) : 1;
    ipc_ok = ipc_ok && opened == 0;
    MPI_Allreduce(&ipc_ok, &both, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("# dedal-bench CUDA Floor Test v" DEDAL_BENCH_VERSION "\n");
        printf("# GPU %d of %d: %s (sm_%d%d), CUDA driver %d.%d\n", rank % ndev, ndev, name, major, minor,
               version / 1000, version % 1000 / 10);
        if (!both) printf("# CUDA IPC between the two processes unavailable: %s\n", err(opened));
        printf("# Size      IPC Latency(us)     D2H+sync(us)     D2D+sync(us)\n");
    }
    char none = 0;
    for (size_t s = 1; s <= max; s *= 2) {
        int iters = iterations(s, 1000, 100), warm = iters / 10;
        double ipc = -1, d2h = -1, d2d = -1, t0 = 0;
        if (both) {  /* the ping-pong: one copy into the peer's buffer + synchronize + a host message, each way */
            MPI_Barrier(MPI_COMM_WORLD);
            for (int i = 0; i < iters + warm; i++) {
                if (i == warm) t0 = now_us();
                if (rank == 0) {
                    MUST(cu.MemcpyDtoDAsync(peer, mine, s, stream));
                    MUST(cu.StreamSynchronize(stream));
                    MPI_Send(&none, 0, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
                    MPI_Recv(&none, 0, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(&none, 0, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MUST(cu.MemcpyDtoDAsync(peer, mine, s, stream));
                    MUST(cu.StreamSynchronize(stream));
                    MPI_Send(&none, 0, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
                }
            }
            ipc = (now_us() - t0) / (2.0 * iters);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {  /* one process's own copies, while the other waits */
            for (int i = 0; i < iters + warm; i++) {
                if (i == warm) t0 = now_us();
                MUST(cu.MemcpyDtoHAsync(host, mine, s, stream));
                MUST(cu.StreamSynchronize(stream));
            }
            d2h = (now_us() - t0) / iters;
            for (int i = 0; i < iters + warm; i++) {
                if (i == warm) t0 = now_us();
                MUST(cu.MemcpyDtoDAsync(scratch, mine, s, stream));
                MUST(cu.StreamSynchronize(stream));
            }
            d2d = (now_us() - t0) / iters;
            char col[32];
            if (ipc < 0) snprintf(col, sizeof col, "-"); else snprintf(col, sizeof col, "%.2f", ipc);
            printf("%-10zu %18s %16.2f %16.2f\n", s, col, d2h, d2d);
            fflush(stdout);
        }
    }
    if (both) {  /* copy bandwidth into the peer's buffer: a window of copies, one synchronize */
        if (rank == 0) {
            printf("# dedal-bench CUDA Copy Bandwidth Test v" DEDAL_BENCH_VERSION "\n");
            printf("# Size      Bandwidth (MB/s)\n");
        }
        for (size_t s = 1; s <= max; s *= 2) {
            int iters = iterations(s, 100, 20), warm = 2;
            double t0 = 0;
            MPI_Barrier(MPI_COMM_WORLD);
            if (rank == 0) {
                for (int i = 0; i < iters + warm; i++) {
                    if (i == warm) t0 = now_us();
                    for (int w = 0; w < WINDOW; w++) MUST(cu.MemcpyDtoDAsync(peer + w * s, mine + w * s, s, stream));
                    MUST(cu.StreamSynchronize(stream));
                }
                printf("%-10zu %18.2f\n", s, (double)s * WINDOW * iters / (now_us() - t0));
                fflush(stdout);
            }
        }
        MPI_Barrier(MPI_COMM_WORLD);
        cu.IpcCloseMemHandle(peer);
    }
    MPI_Finalize();
    return 0;
}
