/* What the CUDA driver calls behind zcta's per-op timing cost, and how they behave
 * around stream capture. No CUDA headers needed: the few driver types are declared
 * here; libcuda.so.1 is opened with dlopen.
 *   cc -O2 -o cuda_costs bench/cuda_costs.c -ldl -lpthread && ./cuda_costs
 * Prints one "name value" line per measurement (host ns per call, medians of blocks). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUevent;
typedef int CUdevice;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(CUdevice*, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuCtxGetCurrent)(CUcontext*);
static CUresult (*cuStreamCreate)(CUstream*, unsigned);
static CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
static CUresult (*cuStreamIsCapturing)(CUstream, int*);
static CUresult (*cuStreamBeginCapture)(CUstream, int);
static CUresult (*cuStreamEndCapture)(CUstream, void**);
static CUresult (*cuEventCreate)(CUevent*, unsigned);
static CUresult (*cuEventRecord)(CUevent, CUstream);
static CUresult (*cuEventQuery)(CUevent);
static CUresult (*cuEventSynchronize)(CUevent);
static CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
static CUresult (*cuThreadExchangeStreamCaptureMode)(int*);
static CUresult (*cuMemAlloc)(unsigned long long*, size_t);
static CUresult (*cuMemsetD32Async)(unsigned long long, unsigned, size_t, CUstream);
static CUresult (*cuStreamSynchronize)(CUstream);

static void* H;
#define LOAD(name) do { *(void**)&name = dlsym(H, #name); if (!name) { printf("missing %s\n", #name); exit(1);} } while (0)
#define CK(x) do { CUresult r_ = (x); if (r_) { printf("FAIL %s = %d (line %d)\n", #x, r_, __LINE__); exit(1);} } while (0)

static int64_t now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static int cmp(const void* a, const void* b) {
  int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return (x > y) - (x < y);
}
static int64_t median(int64_t* v, int n) { qsort(v, n, sizeof *v, cmp); return v[n / 2]; }

#define N 2000
#define BLOCKS 9
static CUevent ev[N];
static CUstream s1, s2;

static CUevent g_done;
static CUresult g_thread_rc, g_thread_rc_relaxed;
static void* other_thread(void* arg) {
  (void)arg;
  g_thread_rc = cuEventQuery(g_done);           /* default (global) mode */
  int mode = 2;                                 /* CU_STREAM_CAPTURE_MODE_RELAXED */
  cuThreadExchangeStreamCaptureMode(&mode);
  g_thread_rc_relaxed = cuEventQuery(g_done);
  return NULL;
}

int main(void) {
  H = dlopen("libcuda.so.1", RTLD_NOW);
  if (!H) { printf("no libcuda: %s\n", dlerror()); return 1; }
  LOAD(cuInit); LOAD(cuDeviceGet); LOAD(cuDevicePrimaryCtxRetain); LOAD(cuCtxSetCurrent);
  LOAD(cuCtxGetCurrent); LOAD(cuStreamCreate); LOAD(cuStreamGetCtx); LOAD(cuStreamIsCapturing);
  LOAD(cuStreamBeginCapture); LOAD(cuStreamEndCapture); LOAD(cuEventCreate); LOAD(cuEventRecord);
  LOAD(cuEventQuery); LOAD(cuEventSynchronize); LOAD(cuEventElapsedTime);
  LOAD(cuThreadExchangeStreamCaptureMode); LOAD(cuStreamSynchronize);
  *(void**)&cuMemAlloc = dlsym(H, "cuMemAlloc_v2");
  *(void**)&cuMemsetD32Async = dlsym(H, "cuMemsetD32Async");
  printf("sym cuEventElapsedTime_v2 %s\n", dlsym(H, "cuEventElapsedTime_v2") ? "yes" : "no");
  printf("sym cuStreamGetCtx_v2 %s\n", dlsym(H, "cuStreamGetCtx_v2") ? "yes" : "no");
  printf("sym cuEventRecord_ptsz %s\n", dlsym(H, "cuEventRecord_ptsz") ? "yes" : "no");
  CUdevice d; CUcontext ctx;
  CK(cuInit(0)); CK(cuDeviceGet(&d, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, d)); CK(cuCtxSetCurrent(ctx));
  CK(cuStreamCreate(&s1, 1)); CK(cuStreamCreate(&s2, 1));
  for (int i = 0; i < N; i++) CK(cuEventCreate(&ev[i], 0));
  int64_t blk[BLOCKS];
  int64_t t0, t1;
  int st; CUcontext c;
#define TIME(label, body) do { \
    for (int b = 0; b < BLOCKS; b++) { t0 = now(); for (int i = 0; i < N; i++) { body; } t1 = now(); \
      blk[b] = (t1 - t0) / N; CK(cuStreamSynchronize(s1)); } \
    printf("%s %lld\n", label, (long long)median(blk, BLOCKS)); } while (0)
  TIME("ns_clock_gettime", (void)now());
  TIME("ns_cuCtxGetCurrent", CK(cuCtxGetCurrent(&c)));
  TIME("ns_cuStreamIsCapturing", CK(cuStreamIsCapturing(s1, &st)));
  TIME("ns_cuStreamIsCapturing_legacy", CK(cuStreamIsCapturing(0, &st)));
  TIME("ns_cuStreamGetCtx", CK(cuStreamGetCtx(s1, &c)));
  TIME("ns_cuEventRecord_idle", CK(cuEventRecord(ev[i], s1)));
  TIME("ns_cuEventRecord_legacy", CK(cuEventRecord(ev[i], 0)));
  TIME("ns_cuEventQuery_done", CK(cuEventQuery(ev[i])));
  /* Event records on a stream busy with work ahead. */
  unsigned long long buf = 0;
  if (cuMemAlloc && cuMemsetD32Async && cuMemAlloc(&buf, 64 << 20) == 0) {
    TIME("ns_memset_only", CK(cuMemsetD32Async(buf, i, 1024, s1)));
    TIME("ns_memset_plus_2_records", { CK(cuEventRecord(ev[i], s1)); CK(cuMemsetD32Async(buf, i, 1024, s1)); CK(cuEventRecord(ev[(i + 1) % N], s1)); });
    /* GPU cost of the records: GPU time of 2000 small memsets with and without records between */
    CUevent a, z; CK(cuEventCreate(&a, 0)); CK(cuEventCreate(&z, 0));
    float ms0 = 0, ms1 = 0;
    CK(cuEventRecord(a, s1)); for (int i = 0; i < N; i++) CK(cuMemsetD32Async(buf, i, 1024, s1)); CK(cuEventRecord(z, s1));
    CK(cuEventSynchronize(z)); CK(cuEventElapsedTime(&ms0, a, z));
    CK(cuEventRecord(a, s1)); for (int i = 0; i < N; i++) { CK(cuEventRecord(ev[i], s1)); CK(cuMemsetD32Async(buf, i, 1024, s1)); CK(cuEventRecord(ev[(i+7)%N], s1)); }
    CK(cuEventRecord(z, s1)); CK(cuEventSynchronize(z)); CK(cuEventElapsedTime(&ms1, a, z));
    printf("gpu_ns_per_memset %.0f\ngpu_ns_per_memset_with_2_records %.0f\n", ms0 * 1e6 / N, ms1 * 1e6 / N);
  }
  /* Negative elapsed time: end recorded before start. */
  {
    CUevent a, z; float ms = 0; CK(cuEventCreate(&a, 0)); CK(cuEventCreate(&z, 0));
    CK(cuEventRecord(z, s1)); CK(cuEventSynchronize(z));
    struct timespec ts = {0, 2000000}; nanosleep(&ts, NULL);
    CK(cuEventRecord(a, s1)); CK(cuEventSynchronize(a));
    CUresult r = cuEventElapsedTime(&ms, a, z);
    printf("elapsed_reverse_rc %d ms %.4f\n", r, ms);
  }
  /* Anchor brackets: record on an idle stream, spin until done. */
  {
    int64_t br[200];
    CUevent a; CK(cuEventCreate(&a, 0));
    for (int i = 0; i < 200; i++) {
      int64_t b0 = now(); CK(cuEventRecord(a, s2));
      while (cuEventQuery(a) != 0) {}
      br[i] = now() - b0;
    }
    qsort(br, 200, sizeof *br, cmp);
    printf("anchor_bracket_ns min %lld p50 %lld p90 %lld max %lld\n", (long long)br[0], (long long)br[100], (long long)br[180], (long long)br[199]);
    /* Drift: host vs GPU over ~1 s between two anchors. */
    CUevent a1, a2; CK(cuEventCreate(&a1, 0)); CK(cuEventCreate(&a2, 0));
    int64_t h1 = now(); CK(cuEventRecord(a1, s2)); while (cuEventQuery(a1) != 0) {} int64_t h1e = now();
    struct timespec ts = {1, 0}; nanosleep(&ts, NULL);
    int64_t h2 = now(); CK(cuEventRecord(a2, s2)); while (cuEventQuery(a2) != 0) {} int64_t h2e = now();
    float ms; CK(cuEventElapsedTime(&ms, a1, a2));
    double host = ((h2 + h2e) - (h1 + h1e)) / 2.0;
    printf("drift_1s_ns %.0f (gpu %.0f ns host %.0f ns, brackets %lld %lld)\n", ms * 1e6 - host, ms * 1e6, host, (long long)(h1e - h1), (long long)(h2e - h2));
  }
  /* Capture, in global mode by this thread: on a non-blocking and on a blocking stream. */
  for (int blocking = 0; blocking < 2; blocking++) {
    CUstream cs_stream; CK(cuStreamCreate(&cs_stream, blocking ? 0 : 1));
    const char* k = blocking ? "blocking" : "nonblocking";
    CUevent done; CK(cuEventCreate(&done, 0)); CK(cuEventRecord(done, s1)); CK(cuEventSynchronize(done));
    g_done = done;
    CK(cuStreamBeginCapture(cs_stream, 0 /* GLOBAL */));
    int cs = -1;
    CUresult r1 = cuStreamIsCapturing(cs_stream, &cs);
    printf("capture_%s_is_capturing_rc %d status %d\n", k, r1, cs);
    CUresult r2 = cuStreamIsCapturing(s1, &cs);
    printf("capture_%s_other_stream_is_capturing_rc %d status %d\n", k, r2, cs);
    int cs0 = -1;
    CUresult r0 = cuStreamIsCapturing(0, &cs0);
    printf("capture_%s_is_capturing_legacy_rc %d status %d\n", k, r0, cs0);
    r1 = cuStreamIsCapturing(cs_stream, &cs);
    printf("capture_%s_after_legacy_query_status rc %d status %d\n", k, r1, cs);
    CUresult rq = cuEventQuery(done);
    printf("capture_%s_event_query_same_thread_rc %d\n", k, rq);
    CUresult rr = cuEventRecord(ev[0], s1);
    printf("capture_%s_record_other_stream_rc %d\n", k, rr);
    CUcontext c2; CUresult rc2 = cuStreamGetCtx(cs_stream, &c2);
    printf("capture_%s_get_ctx_rc %d\n", k, rc2);
    pthread_t th; pthread_create(&th, NULL, other_thread, NULL); pthread_join(th, NULL);
    printf("capture_%s_event_query_other_thread_rc %d relaxed %d\n", k, g_thread_rc, g_thread_rc_relaxed);
    void* g = NULL;
    CUresult re = cuStreamEndCapture(cs_stream, &g);
    printf("capture_%s_end_rc %d graph %s\n", k, re, g ? "yes" : "no");
  }
  return 0;
}
