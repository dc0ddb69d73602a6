// 32 threads of malloc/calloc/realloc/free churn, in 4 waves (threads start
// and exit while others allocate). Prints a checksum that depends only on
// the data written, so it is the same with and without the profiler.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 64
static int iters = 20000;

static uint64_t next(uint64_t *s) {
  *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s;
}

static void *worker(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1;
  unsigned char *slot[SLOTS] = {0};
  size_t len[SLOTS] = {0};
  uint64_t sum = 0;
  for (int i = 0; i < iters; i++) {
    uint64_t r = next(&seed);
    int k = r % SLOTS;
    size_t n = 1 + (r >> 8) % 8192;
    switch ((r >> 32) % 4) {
    case 0: case 1:
      if (slot[k]) { for (size_t j = 0; j < len[k]; j += 64) sum += slot[k][j]; free(slot[k]); }
      slot[k] = (r >> 40) % 2 ? malloc(n) : calloc(1, n);
      if (!slot[k]) abort();
      memset(slot[k], (int)(r & 0xff), n);
      len[k] = n;
      break;
    case 2: {
      unsigned char *p = realloc(slot[k], n);
      if (!p) abort();
      if (n > len[k]) memset(p + len[k], (int)(r & 0xff), n - len[k]);
      slot[k] = p; len[k] = n;
      break;
    }
    default:
      if (slot[k]) { sum += slot[k][0]; free(slot[k]); slot[k] = NULL; len[k] = 0; }
    }
  }
  for (int k = 0; k < SLOTS; k++) free(slot[k]);
  return (void *)(uintptr_t)sum;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 32;
  if (argc > 2) iters = atoi(argv[2]);
  uint64_t total = 0;
  int waves = 4, per = threads / waves ? threads / waves : 1;
  for (int w = 0; w < waves; w++) {
    pthread_t t[64];
    // Overlap: start this wave's threads, then join the previous wave's.
    for (int i = 0; i < per; i++)
      pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(w * per + i + 1));
    for (int i = 0; i < per; i++) { void *v; pthread_join(t[i], &v); total += (uint64_t)(uintptr_t)v; }
  }
  // The remaining threads all at once.
  pthread_t t[64];
  int rest = threads - waves * per;
  for (int i = 0; i < rest; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(1000 + i));
  for (int i = 0; i < rest; i++) { void *v; pthread_join(t[i], &v); total += (uint64_t)(uintptr_t)v; }
  printf("churn threads=%d checksum=%llu\n", threads, (unsigned long long)total);
  return 0;
}
