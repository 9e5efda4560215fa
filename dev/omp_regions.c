// Counts the OpenMP parallel regions (with more than one thread) and barriers a process runs, and the
// caller's wall time inside those regions: an LD_PRELOAD shim over libgomp's entry points, for the
// "regions per decoded token" figure of docs/benchmarks.md section 3.4 without touching the engine.
// Build: gcc -O2 -shared -fPIC dev/omp_regions.c -o /tmp/omp_regions.so -ldl -lgomp
// Use:   LD_PRELOAD=/tmp/omp_regions.so m3serve generate ...   (prints one line to stderr at exit)
// Run two generations that differ only in --max-tokens: the difference over the token difference
// is the per-token count of the decode step.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

int omp_get_num_threads(void);
int omp_get_thread_num(void);

static atomic_long regions, serial_regions, barriers, loop_ends, region_ns;

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) {
  static void (*real)(void (*)(void*), void*, unsigned, unsigned);
  if (!real) real = dlsym(RTLD_NEXT, "GOMP_parallel");
  if (num_threads == 1) {  // an `if (false)` clause: the body runs on the caller, no team
    atomic_fetch_add(&serial_regions, 1);
    real(fn, data, num_threads, flags);
    return;
  }
  atomic_fetch_add(&regions, 1);
  const long t0 = now_ns();
  real(fn, data, num_threads, flags);
  atomic_fetch_add(&region_ns, now_ns() - t0);
}

void GOMP_barrier(void) {
  static void (*real)(void);
  if (!real) real = dlsym(RTLD_NEXT, "GOMP_barrier");
  if (omp_get_num_threads() > 1 && omp_get_thread_num() == 0) atomic_fetch_add(&barriers, 1);
  real();
}

void GOMP_loop_end(void) {  // the implicit barrier at the end of an `omp for` without nowait
  static void (*real)(void);
  if (!real) real = dlsym(RTLD_NEXT, "GOMP_loop_end");
  // Once per barrier (the master's call) and only in a real team: a one-thread team waits for no one.
  if (omp_get_num_threads() > 1 && omp_get_thread_num() == 0) atomic_fetch_add(&loop_ends, 1);
  real();
}

__attribute__((destructor)) static void report(void) {
  fprintf(stderr, "omp_regions: parallel %ld serial %ld barrier %ld loop_end %ld region_ms %.1f\n", regions,
          serial_regions, barriers, loop_ends, region_ns / 1e6);
}
