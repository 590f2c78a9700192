/* A stand-in for the NVIDIA driver's libcuda.so.1, for tests on machines without a GPU: the
 * driver API calls that dedal_cuda_floor makes, on host memory. "Device" allocations are
 * shared-memory files, so that the IPC handle (the file's name) opens in another process as
 * cuIpcOpenMemHandle would (and removed when the process ends); copies are memcpy, streams
 * complete at once. Built with
 * `cc -shared -fPIC -o libcuda.so.1 fake_libcuda.c`. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;
static struct { CUdeviceptr ptr; size_t size; char name[40]; } allocs[16];
static int nallocs;

int cuInit(unsigned flags) { (void)flags; return 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
int cuDeviceGetName(char *name, int len, int d) { (void)d; snprintf(name, len, "fake GPU"); return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) { (void)d; *v = attr == 75 ? 9 : 0; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int d) { (void)d; *ctx = (void *)1; return 0; }
int cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
int cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = (void *)1; return 0; }
int cuStreamSynchronize(void *s) { (void)s; return 0; }
int cuGetErrorString(int r, const char **s) { *s = r ? "fake CUDA error" : "no error"; return 0; }

int cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (nallocs == 16) return 2;
    snprintf(allocs[nallocs].name, sizeof allocs[nallocs].name, "/dedal-fakecuda.%d.%d", (int)getpid(), nallocs);
    int fd = shm_open(allocs[nallocs].name, O_CREAT | O_RDWR | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)n) != 0) return 2;
    void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return 2;
    allocs[nallocs].ptr = *p = (CUdeviceptr)m;
    allocs[nallocs++].size = n;
    return 0;
}
int cuMemFree_v2(CUdeviceptr p) { (void)p; return 0; }
int cuMemHostAlloc(void **p, size_t n, unsigned flags) { (void)flags; *p = malloc(n); return *p ? 0 : 2; }
int cuMemsetD8_v2(CUdeviceptr p, unsigned char c, size_t n) { memset((void *)p, c, n); return 0; }
int cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) { (void)s; memcpy(dst, (void *)src, n); return 0; }
int cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
    (void)s; memcpy((void *)dst, (void *)src, n); return 0;
}
int cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].ptr == p) {
            memset(h, 0, sizeof *h);
            snprintf(h->reserved, sizeof h->reserved, "%s %zu", allocs[i].name, allocs[i].size);
            return 0;
        }
    return 1;
}
int cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags) {
    char name[40];
    size_t n;
    (void)flags;
    if (sscanf(h.reserved, "%39s %zu", name, &n) != 2) return 1;
    int fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) return 1;
    void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    shm_unlink(name); /* the owner's mapping stays; nothing is left in /dev/shm */
    if (m == MAP_FAILED) return 1;
    *p = (CUdeviceptr)m;
    return 0;
}
int cuIpcCloseMemHandle(CUdeviceptr p) { (void)p; return 0; }

/* this process's shared-memory files go when it ends (a peer that opened one unlinked it already) */
__attribute__((destructor)) static void remove_files(void) {
    for (int i = 0; i < nallocs; i++) shm_unlink(allocs[i].name);
}
