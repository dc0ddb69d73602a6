/* Short-lived threads: N threads one after the other, each burning MS
 * milliseconds of its own CPU in short_work() and exiting, each shorter
 * than the watcher's 50 ms scan. Only a thread that arms its CPU timer at
 * its start (the client's pthread_create) is sampled whole.
 *
 *   short_threads N MS        prints `burned NS` (the threads' CPU, ns) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;
static uint64_t burn_ns;

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) void short_work(void) {
  uint64_t end = thread_cpu_ns() + burn_ns;
  while (thread_cpu_ns() < end)
    for (int i = 0; i < 10000; i++) sink = sink * 6364136223846793005ull + 1;
  sink++;
}

static void *run(void *arg) {
  short_work();
  *(uint64_t *)arg = thread_cpu_ns();
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20;
  burn_ns = (argc > 2 ? strtoull(argv[2], NULL, 10) : 20) * 1000000ull;
  usleep(200000); /* the profile is running */
  uint64_t total = 0;
  for (int i = 0; i < n; i++) {
    uint64_t used = 0;
    pthread_t t;
    pthread_create(&t, NULL, run, &used);
    pthread_join(t, NULL);
    total += used;
  }
  printf("burned %llu\n", (unsigned long long)total);
  return 0;
}
