// Every thread, the main one included, allocates and frees in a tight loop
// (busy_churn), so a stop almost always lands inside malloc: the attach
// must find a safe point anyway (or give up cleanly), and must not corrupt
// anything. Each round of each thread computes the checksum of a fixed
// sequence; a round that disagrees with the first prints "MISMATCH" and
// exits 1. SIGTERM ends the loops; the program then prints
// "rounds=<total> ok" and exits 0.
//
// Usage: busy THREADS (workers besides the main thread). Prints "ready".
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

__attribute__((noinline)) static uint64_t busy_round(void) {
  void *keep[32] = {0};
  uint64_t x = 0x123456789abcdefull, sum = 0;
  for (int i = 0; i < 4096; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t n = 8 + x % 20000;
    unsigned char *p = malloc(n);
    p[0] = (unsigned char)x;
    p[n - 1] = (unsigned char)(x >> 8);
    sum = sum * 31 + p[0] + p[n - 1] + n;
    free(keep[i % 32]);
    keep[i % 32] = p;
  }
  for (int i = 0; i < 32; i++) free(keep[i]);
  return sum;
}

static unsigned long busy_churn(void) {
  uint64_t first = busy_round();
  unsigned long rounds = 1;
  while (!stop) {
    if (busy_round() != first) {
      printf("MISMATCH\n");
      fflush(stdout);
      exit(1);
    }
    rounds++;
  }
  return rounds;
}

static void *worker(void *arg) {
  *(unsigned long *)arg = busy_churn();
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  if (n > 64) n = 64;
  signal(SIGTERM, on_term);
  pthread_t t[64];
  unsigned long rounds[65] = {0};
  for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, worker, &rounds[i + 1]);
  printf("ready\n");
  fflush(stdout);
  rounds[0] = busy_churn();
  unsigned long total = rounds[0];
  for (int i = 0; i < n; i++) {
    pthread_join(t[i], NULL);
    total += rounds[i + 1];
  }
  printf("rounds=%lu ok\n", total);
  return 0;
}
