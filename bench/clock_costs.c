// What one read of each host clock costs on this machine, in a tight loop:
// clock_gettime (CLOCK_REALTIME and CLOCK_MONOTONIC, through the vDSO where the
// kernel's clock source allows it) and the time-stamp counter (rdtsc, rdtscp).
// The shim reads the TSC where /proc/cpuinfo says it is invariant (constant_tsc and
// nonstop_tsc) and clock_gettime(CLOCK_REALTIME) otherwise; a send/recv group makes
// 8 reads. Prints the clock source, those flags, and ns per read (median of 7 runs
// of N reads).
//   cc -O2 -o clock_costs bench/clock_costs.c && ./clock_costs [N]
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static volatile uint64_t sink;

static double run(int which, long n) {
  double t = now_s();
  uint64_t acc = 0;
  unsigned aux;
  struct timespec ts;
  for (long i = 0; i < n; i++) {
    switch (which) {
      case 0: clock_gettime(CLOCK_REALTIME, &ts); acc += (uint64_t)ts.tv_nsec; break;
      case 1: clock_gettime(CLOCK_MONOTONIC, &ts); acc += (uint64_t)ts.tv_nsec; break;
      case 2: acc += __rdtsc(); break;
      case 3: acc += __rdtscp(&aux); break;
    }
  }
  sink = acc;
  return (now_s() - t) / n * 1e9;
}

static void show_file(const char* label, const char* path) {
  char buf[256] = "?";
  FILE* f = fopen(path, "r");
  if (f) {
    if (!fgets(buf, sizeof buf, f)) strcpy(buf, "?");
    fclose(f);
  }
  buf[strcspn(buf, "\n")] = 0;
  printf("%s: %s\n", label, buf);
}

int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : 2000000;
  show_file("clocksource", "/sys/devices/system/clocksource/clocksource0/current_clocksource");
  FILE* f = fopen("/proc/cpuinfo", "r");
  char line[8192];
  int model = 0, flags = 0;
  while (f && fgets(line, sizeof line, f)) {
    if (!model && !strncmp(line, "model name", 10)) { printf("%s", line); model = 1; }
    if (!flags && !strncmp(line, "flags", 5)) {
      flags = 1;
      printf("constant_tsc: %s, nonstop_tsc: %s\n", strstr(line, " constant_tsc") ? "yes" : "no",
             strstr(line, " nonstop_tsc") ? "yes" : "no");
    }
  }
  if (f) fclose(f);
  const char* names[] = {"clock_gettime(CLOCK_REALTIME)", "clock_gettime(CLOCK_MONOTONIC)", "rdtsc", "rdtscp"};
  for (int w = 0; w < 4; w++) {
    double r[7];
    run(w, n / 10);
    for (int i = 0; i < 7; i++) r[i] = run(w, n);
    qsort(r, 7, sizeof r[0], cmp);
    printf("%-32s %6.1f ns per read (min %.1f, max %.1f)\n", names[w], r[3], r[0], r[6]);
  }
  return 0;
}
