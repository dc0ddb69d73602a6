// The workload of the attach benchmark (src/bin/heapprofd-attach-bench.rs):
// THREADS threads each run rounds of PAIRS malloc/free pairs (sizes 16..4096
// from a fixed xorshift sequence, at call depth 20, like the client bench)
// and print, per round, "round <thread> <end ns> <duration ns>" with
// CLOCK_MONOTONIC times, until ROUNDS rounds are done. Prints "ready" first.
//
// Usage: rounds THREADS PAIRS ROUNDS
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long pairs, rounds;
static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

__attribute__((noinline)) static uint64_t deep(int depth, uint64_t *x) {
  if (depth > 0) return deep(depth - 1, x) + 1;
  uint64_t s = 0;
  for (long i = 0; i < pairs; i++) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    unsigned char *p = malloc(16 + *x % 4081);
    p[0] = (unsigned char)*x;
    s += p[0];
    __asm__ volatile("" ::"r"(p) : "memory");
    free(p);
  }
  return s;
}

static void *run(void *arg) {
  long id = (long)arg;
  uint64_t x = 0x9E3779B97F4A7C15ull + (uint64_t)id;
  for (long r = 0; r < rounds; r++) {
    uint64_t t0 = now_ns();
    deep(20, &x);
    uint64_t t1 = now_ns();
    pthread_mutex_lock(&out);
    printf("round %ld %llu %llu\n", id, (unsigned long long)t1, (unsigned long long)(t1 - t0));
    fflush(stdout);
    pthread_mutex_unlock(&out);
  }
  return NULL;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  pairs = argc > 2 ? atol(argv[2]) : 100000;
  rounds = argc > 3 ? atol(argv[3]) : 100;
  if (threads < 1) threads = 1;
  if (threads > 64) threads = 64;
  printf("ready\n");
  fflush(stdout);
  pthread_t t[64];
  for (long i = 1; i < threads; i++) pthread_create(&t[i], NULL, run, (void *)i);
  run((void *)0);
  for (long i = 1; i < threads; i++) pthread_join(t[i], NULL);
  return 0;
}
