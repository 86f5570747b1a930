/* What the shim adds to a send/recv group on the real NCCL, in ns, measured in one
 * process without Python: blocks of groups (ncclGroupStart, ncclSend, ncclRecv,
 * ncclGroupEnd to itself on a one-rank communicator) called through the global scope
 * (the preloaded shim's exports, recording on) alternate with blocks called through
 * libnccl's own functions (its handle's symbols, which the preload does not
 * interpose; recording paused), each group timed on its own with a busy gap after it
 * so the GPU keeps up and the host's time is what is measured. Prints the host ns per
 * group of each side and the median over block pairs of their difference. Without
 * the shim both sides call libnccl (an A/A).
 *
 *   cc -O2 -o sr_ab bench/sr_ab.c -ldl
 *   NCCL_NVLS_ENABLE=0 [LD_PRELOAD=libzcta_prof.so] ./sr_ab LIBNCCL [BYTES (8)]
 *       [GROUPS_PER_BLOCK (4000)] [BLOCKS (20)] [GAP_NS (4000)]
 *
 * Needs a GPU (libcuda.so.1) and the libnccl the program should load (its path).
 * SR_AB_NO_CUDA=1 skips CUDA (the stand-in libnccl of tests/fixtures needs none).
 * EVICT_DATA_KB / EVICT_CODE_KB: before every NCCL call, on both sides, touch that
 * much data (a store to each 64-byte line) and run that much code (a 64-byte block
 * of nops per line): the caches the real NCCL leaves between calls, on a machine
 * where the stand-in's calls leave them warm. */
#include <sys/mman.h>
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*fn0)(void);
typedef int (*send_fn)(const void*, size_t, int, int, void*, void*);
typedef int (*recv_fn)(void*, size_t, int, int, void*, void*);
typedef struct {
  char internal[128];
} uid_t128;
typedef int (*uid_fn)(uid_t128*);
typedef int (*init_fn)(void**, int, uid_t128, int);
typedef int (*destroy_fn)(void*);

struct api {
  fn0 start, end;
  send_fn send;
  recv_fn recv;
};

static void die(const char* m) {
  fprintf(stderr, "sr_ab: %s\n", m);
  exit(2);
}

static void* sym(void* h, const char* n) {
  void* p = dlsym(h, n);
  if (p == NULL) {
    fprintf(stderr, "sr_ab: no %s\n", n);
    exit(2);
  }
  return p;
}

static long long now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static volatile unsigned char* evict_data;
static size_t evict_data_n;
static void (*evict_code)(void);
static size_t evict_code_n;

static void evict(void) {
  for (size_t i = 0; i < evict_data_n; i += 64) evict_data[i]++;
  for (size_t i = 0; i < evict_code_n; i += 64) ((void (*)(void))((char*)evict_code + i))();
}

static void evict_setup(void) {
  const char* d = getenv("EVICT_DATA_KB");
  const char* c = getenv("EVICT_CODE_KB");
  if (d != NULL && atol(d) > 0) {
    evict_data_n = (size_t)atol(d) * 1024;
    evict_data = calloc(evict_data_n, 1);
    if (evict_data == NULL) die("no memory for EVICT_DATA_KB");
  }
  if (c != NULL && atol(c) > 0) {
    evict_code_n = (size_t)atol(c) * 1024;
    unsigned char* p = mmap(NULL, evict_code_n, PROT_READ | PROT_WRITE | PROT_EXEC,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("cannot map code for EVICT_CODE_KB");
    for (size_t i = 0; i < evict_code_n; i += 64) {
      memset(p + i, 0x90, 63); /* nop */
      p[i + 63] = 0xc3;        /* ret */
    }
    evict_code = (void (*)(void))p;
  }
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char** argv) {
  if (argc < 2) die("usage: sr_ab LIBNCCL [BYTES] [GROUPS_PER_BLOCK] [BLOCKS] [GAP_NS]");
  size_t bytes = argc > 2 ? strtoull(argv[2], NULL, 10) : 8;
  long k = argc > 3 ? atol(argv[3]) : 4000;
  int blocks = argc > 4 ? atoi(argv[4]) : 20;
  long gap = argc > 5 ? atol(argv[5]) : 4000;
  if (blocks < 2 || blocks > 1000 || k < 1) die("bad GROUPS_PER_BLOCK or BLOCKS");

  evict_setup();
  uint64_t a = 0x1000, b = 0x2000;
  size_t n = bytes < 4 ? 1 : bytes / 4;
  int (*cuStreamSync)(void*) = NULL;
  const char* nc = getenv("SR_AB_NO_CUDA");
  if (nc == NULL || strcmp(nc, "1") != 0) {
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (cuda == NULL) die("no libcuda.so.1");
    int (*cuInit)(unsigned) = sym(cuda, "cuInit");
    int (*cuDeviceGet)(int*, int) = sym(cuda, "cuDeviceGet");
    int (*cuPrimaryRetain)(void**, int) = sym(cuda, "cuDevicePrimaryCtxRetain");
    int (*cuCtxSetCurrent)(void*) = sym(cuda, "cuCtxSetCurrent");
    int (*cuMemAlloc)(uint64_t*, size_t) = sym(cuda, "cuMemAlloc_v2");
    cuStreamSync = sym(cuda, "cuStreamSynchronize");
    int dev;
    void* ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuPrimaryRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
      die("CUDA init failed");
    if (cuMemAlloc(&a, n * 4) || cuMemAlloc(&b, n * 4)) die("cuMemAlloc failed");
  }
  void* stream = NULL; /* the legacy default stream, as torch's current stream */

  void* nccl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (nccl == NULL) die(dlerror());
  struct api direct = {sym(nccl, "ncclGroupStart"), sym(nccl, "ncclGroupEnd"), sym(nccl, "ncclSend"),
                       sym(nccl, "ncclRecv")};
  struct api shim = direct;
  int (*set_recording)(int) = dlsym(RTLD_DEFAULT, "zcta_set_recording");
  if (set_recording != NULL) {
    shim.start = sym(RTLD_DEFAULT, "ncclGroupStart");
    shim.end = sym(RTLD_DEFAULT, "ncclGroupEnd");
    shim.send = sym(RTLD_DEFAULT, "ncclSend");
    shim.recv = sym(RTLD_DEFAULT, "ncclRecv");
  }
  init_fn init = set_recording ? sym(RTLD_DEFAULT, "ncclCommInitRank") : sym(nccl, "ncclCommInitRank");
  uid_t128 uid;
  if (((uid_fn)sym(nccl, "ncclGetUniqueId"))(&uid)) die("ncclGetUniqueId failed");
  void* comm;
  if (init(&comm, 1, uid, 0)) die("ncclCommInitRank failed");

  double on_ns[1000], off_ns[1000], diff[1000], ratio[1000];
  for (int warm = 0; warm < 2000; warm++) {
    evict();
    shim.start();
    shim.send((void*)a, n, 7, 0, comm, stream);
    shim.recv((void*)b, n, 7, 0, comm, stream);
    shim.end();
  }
  if (cuStreamSync) cuStreamSync(stream);
  for (int blk = 0; blk < blocks; blk++) {
    for (int half = 0; half < 2; half++) {
      int on = (half == 0) == (blk % 2 == 0);
      struct api* f = on ? &shim : &direct;
      if (set_recording) set_recording(on);
      long long inside = 0;
      int rc = 0;
      for (long i = 0; i < k; i++) {
        long long t0, t1, in = 0;
        evict();
        t0 = now();
        rc |= f->start();
        t1 = now();
        in += t1 - t0;
        evict();
        t0 = now();
        rc |= f->send((void*)a, n, 7, 0, comm, stream);
        t1 = now();
        in += t1 - t0;
        evict();
        t0 = now();
        rc |= f->recv((void*)b, n, 7, 0, comm, stream);
        t1 = now();
        in += t1 - t0;
        evict();
        t0 = now();
        rc |= f->end();
        t1 = now();
        inside += in + t1 - t0;
        while (now() < t1 + gap) {
        }
      }
      if (cuStreamSync) cuStreamSync(stream);
      if (rc) die("a call failed");
      (on ? on_ns : off_ns)[blk] = (double)inside / (double)k;
    }
    diff[blk] = on_ns[blk] - off_ns[blk];
    ratio[blk] = on_ns[blk] / off_ns[blk];
  }
  if (set_recording) set_recording(1);
  double d = median(diff, blocks), r = median(ratio, blocks);
  double mon = median(on_ns, blocks), moff = median(off_ns, blocks);
  printf("bytes %zu groups/block %ld blocks %d gap %ld ns: shim %.1f ns, direct %.1f ns, added %.1f ns "
         "(%.3fx), median over block pairs\n",
         bytes, k, blocks, gap, mon, moff, d, r);
  ((destroy_fn)(set_recording ? sym(RTLD_DEFAULT, "ncclCommDestroy") : sym(nccl, "ncclCommDestroy")))(comm);
  return 0;
}
