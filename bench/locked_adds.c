/* What a locked read-modify-write costs between record stores, as on the shim's hot
 * path: per "group", three 232-byte records are copied into an 8 MiB ring (the
 * queue's slots) with N counter updates among them, either plain adds or locked adds
 * (__atomic_fetch_add). Prints ns per group. A locked add waits for the thread's
 * pending stores to drain, so its cost shows only beside the stores.
 *   cc -O2 -o locked_adds bench/locked_adds.c && ./locked_adds 11
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static uint64_t counters[48];

static double run(int locked, int n_adds, long groups) {
  const size_t ring = 8u << 20;
  char* buf = aligned_alloc(64, ring);
  if (!buf) exit(1);
  memset(buf, 0, ring);
  char rec[256];
  memset(rec, 1, sizeof rec);
  size_t pos = 0;
  uint64_t t0 = now_ns();
  for (long i = 0; i < groups; i++) {
    for (int r = 0; r < 3; r++) {
      rec[0] = (char)i;
      memcpy(buf + pos, rec, 232);
      pos = (pos + 256) & (ring - 1);
      int k_end = n_adds / 3 + (r < n_adds % 3);
      for (int k = 0; k < k_end; k++) {
        if (locked)
          __atomic_fetch_add(&counters[k], 1, __ATOMIC_RELAXED);
        else
          __atomic_store_n(&counters[k], __atomic_load_n(&counters[k], __ATOMIC_RELAXED) + 1,
                           __ATOMIC_RELAXED);
      }
    }
  }
  double ns = (double)(now_ns() - t0) / (double)groups;
  free(buf);
  return ns;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 11;
  if (n < 0 || n > 48) {
    fprintf(stderr, "usage: locked_adds [N_ADDS (0-48, default 11)]\n");
    return 2;
  }
  for (int round = 0; round < 3; round++)
    printf("%d adds a group: plain %.1f ns, locked %.1f ns per group\n", n, run(0, n, 2000000),
           run(1, n, 2000000));
  return 0;
}
