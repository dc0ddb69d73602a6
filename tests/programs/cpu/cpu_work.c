/* A fixed amount of CPU work on THREADS threads (ITERS iterations of an
 * LCG each, in work()), for the CPU-time profiler's overhead benchmark
 * (scripts/bench-cpu-time.sh): prints the process's CPU time from
 * getrusage, `cpu_ms N`, so runs with and without profiling compare the
 * same work.
 *
 *   cpu_work THREADS ITERS */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

static uint64_t iters;
static volatile uint64_t sink;

__attribute__((noinline)) static uint64_t work(uint64_t n) {
  uint64_t x = n;
  for (uint64_t i = 0; i < n; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}

static void *run(void *arg) {
  (void)arg;
  sink += work(iters);
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  iters = argc > 2 ? strtoull(argv[2], NULL, 10) : 2000000000ull;
  pthread_t t[64];
  if (n > 64) n = 64;
  for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, run, NULL);
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double ms = ru.ru_utime.tv_sec * 1e3 + ru.ru_utime.tv_usec / 1e3 + ru.ru_stime.tv_sec * 1e3 +
              ru.ru_stime.tv_usec / 1e3;
  printf("cpu_ms %.1f\n", ms);
  return 0;
}
