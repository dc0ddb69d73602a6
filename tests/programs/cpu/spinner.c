/* A target for `record --pid --cpu-time` (tests/tests/cpu_time.rs): prints
 * "ready", then burns CPU in spin() on the main thread for ever, never
 * allocating (so a dormant client's next-allocation start never comes);
 * the test kills it.
 *
 *   spinner THREADS   THREADS - 1 more threads block in pause() (1: the
 *                     process stays single-threaded) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile uint64_t sink;

__attribute__((noinline)) static uint64_t spin(uint64_t x) {
  for (int i = 0; i < 1000000; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}

static void *blocked(void *arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  for (int i = 1; i < threads; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, blocked, NULL) != 0) return 1;
  }
  printf("ready\n");
  fflush(stdout);
  for (uint64_t x = 1;;) sink = x = spin(x);
}
