/* Four threads reporting into one custom heap "arena" at once (heapprofd.h).
 *
 * Each thread reports NPER allocations (ids unique per thread, sizes 32 to
 * 88 bytes) from arena_alloc, frees every third, and records SAMPLES
 * allocations of 1000 bytes it sampled itself (AHeapProfile_reportSample)
 * from arena_sampled, freeing none. Prints "recorded=N" (how many reports
 * said they were recorded). Keep the numbers in sync with
 * tests/tests/custom_heaps.rs. */
#include <heapprofd.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#define THREADS 4
#define NPER 20000
#define SAMPLES 100

static uint32_t heap;
static unsigned long recorded;

__attribute__((noinline)) static void arena_alloc(uint64_t base) {
  unsigned long n = 0;
  for (uint64_t i = 0; i < NPER; i++) {
    n += AHeapProfile_reportAllocation(heap, base | i, 32 + (i % 8) * 8);
    if (i % 3 == 0) AHeapProfile_reportFree(heap, base | i);
  }
  __atomic_fetch_add(&recorded, n, __ATOMIC_RELAXED);
}

__attribute__((noinline)) static void arena_sampled(uint64_t base) {
  unsigned long n = 0;
  for (uint64_t i = 0; i < SAMPLES; i++) n += AHeapProfile_reportSample(heap, base | (1u << 30) | i, 1000);
  __atomic_fetch_add(&recorded, n, __ATOMIC_RELAXED);
}

static void *worker(void *arg) {
  uint64_t base = (uint64_t)(uintptr_t)arg << 32;
  arena_alloc(base);
  arena_sampled(base);
  return NULL;
}

int main(void) {
  heap = AHeapProfile_registerHeap(AHeapInfo_create("arena"));
  pthread_t t[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  char line[64];
  int len = snprintf(line, sizeof line, "recorded=%lu\n", recorded);
  write(1, line, len);
  return 0;
}
