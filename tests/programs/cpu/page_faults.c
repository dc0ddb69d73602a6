/* Page faults with a known count: touch_pages() maps, touches and unmaps
 * ROUNDS x 256 fresh pages (one first-touch fault each), while
 * compute() makes none; `record --event page-faults` must put the
 * samples in touch_pages.
 *
 *   page_faults ROUNDS       prints `touched N` (pages) */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile uint64_t sink;

__attribute__((noinline)) void touch_pages(size_t pages) {
  char *p = mmap(NULL, pages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) exit(1);
  for (size_t i = 0; i < pages; i++) p[i * 4096] = (char)i;
  munmap(p, pages * 4096);
  sink++;
}

__attribute__((noinline)) void compute(void) {
  uint64_t x = sink;
  for (int i = 0; i < 200000; i++) x = x * 6364136223846793005ull + 1;
  sink = x;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 200;
  usleep(200000); /* the profiler arms this thread */
  uint64_t touched = 0;
  for (int r = 0; r < rounds; r++) {
    touch_pages(256);
    touched += 256;
    compute();
  }
  printf("touched %llu\n", (unsigned long long)touched);
  return 0;
}
