/* dedal-benchmarks: the CUDA driver API, found at run time (dlopen of libcuda.so.1, the host
 * driver's library that `apptainer --nv` binds into a container), so that the benchmarks build
 * with the image's mpicc alone, no CUDA toolkit, and run with whatever driver the host has.
 * Only the calls the benchmarks make, declared as the driver's cuda.h declares them. */
#ifndef DEDAL_BENCH_CUDA_DRIVER_H
#define DEDAL_BENCH_CUDA_DRIVER_H

#include "common.h"
#include <dlfcn.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef struct { char reserved[64]; } CUipcMemHandle;
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1
#define CU_ATTR_CC_MAJOR 75
#define CU_ATTR_CC_MINOR 76

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*IpcCloseMemHandle)(CUdeviceptr);
    CUresult (*GetErrorString)(CUresult, const char **);
} cu;

static void *lib;

/* the versioned symbol where the driver API has one (cuMemAlloc_v2), else the plain one */
static inline void *sym(const char *name, const char *v2) {
    void *p = v2 ? dlsym(lib, v2) : NULL;
    return p ? p : dlsym(lib, name);
}

static inline const char *load(void) {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) return dlerror();
#define S(f, v2) if (!(*(void **)&cu.f = sym("cu" #f, v2))) return "cu" #f " not in libcuda.so.1"
    S(Init, NULL); S(DriverGetVersion, NULL); S(DeviceGetCount, NULL); S(DeviceGet, NULL);
    S(DeviceGetName, NULL); S(DeviceGetAttribute, NULL); S(DevicePrimaryCtxRetain, NULL);
    S(CtxSetCurrent, NULL); S(MemAlloc, "cuMemAlloc_v2"); S(MemFree, "cuMemFree_v2"); S(MemHostAlloc, NULL);
    S(MemsetD8, "cuMemsetD8_v2"); S(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    S(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"); S(StreamCreate, NULL); S(StreamSynchronize, NULL);
    S(IpcGetMemHandle, NULL); S(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2"); S(IpcCloseMemHandle, NULL);
    S(GetErrorString, NULL);
#undef S
    return NULL;
}

static inline const char *err(CUresult r) {
    const char *s = NULL;
    if (cu.GetErrorString) cu.GetErrorString(r, &s);
    return s ? s : "unknown CUDA error";
}

/* a CUDA call that must work: otherwise every rank stops with the call and its error */
#define MUST(call) do { CUresult r_ = (call); if (r_) { \
    fprintf(stderr, "dedal_cuda_floor: %s failed: %s (%d)\n", #call, err(r_), r_); \
    MPI_Abort(MPI_COMM_WORLD, 3); } } while (0)

/* a device buffer of ``size`` bytes on GPU rank % n, filled with 'a' (the driver loaded, a
 * context current): what `-d cuda` gives the MPI benchmarks instead of host memory */
static inline void *device_buffer(size_t size, int rank) {
    const char *why = load();
    int ndev = 0;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    if (why) {
        fprintf(stderr, "dedal-bench: -d cuda: no CUDA driver: %s\n", why);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MUST(cu.Init(0));
    MUST(cu.DeviceGetCount(&ndev));
    if (ndev < 1) {
        fprintf(stderr, "dedal-bench: -d cuda: no CUDA device\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MUST(cu.DeviceGet(&dev, rank % ndev));
    MUST(cu.DevicePrimaryCtxRetain(&ctx, dev));
    MUST(cu.CtxSetCurrent(ctx));
    MUST(cu.MemAlloc(&p, size ? size : 1));
    MUST(cu.MemsetD8(p, 'a', size ? size : 1));
    return (void *)(uintptr_t)p;
}

/* the buffer of the MPI benchmarks: on the GPU with `-d cuda`, else in host memory */
static inline void *bench_buffer(size_t size, int rank, int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "-d") == 0) {
            if (strcmp(argv[i + 1], "cuda") == 0) return device_buffer(size, rank);
            if (rank == 0) fprintf(stderr, "dedal-bench: -d %s: only cuda is known\n", argv[i + 1]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    return buffer(size);
}

static inline int on_device(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "-d") == 0) return 1;
    return 0;
}
#endif
