/* The cost of a heapprofd_context_activate / heapprofd_context_deactivate
 * pair through heapprofd.h (dlsym'd functions: a load, an indirect call
 * each), as a program pays it. Not a test: a benchmark whose command and
 * results are in docs/PERFORMANCE.md.
 *
 * Usage: bench [PAIRS (default 50000000)] [REPS (default 5)]. Prints
 * "client=yes|no", then per repetition "pair_ns=X" and at the end
 * "min_pair_ns=X". The context is `endpoint=/a`; with a running profile
 * that filters by context, activation reads the context's cached match.
 * Times are the thread's CPU time (a shared machine's other processes
 * do not count; their cache and core contention still does). */
#include <heapprofd.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* preemption by other processes left out */
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
  unsigned long pairs = argc > 1 ? strtoul(argv[1], NULL, 10) : 50000000;
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  const char *k[] = {"endpoint"}, *v[] = {"/a"};
  uint64_t ctx = heapprofd_context_create(0, k, v, 1);
  printf("client=%s\n", ctx ? "yes" : "no");
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    for (unsigned long i = 0; i < pairs; i++) {
      uint64_t token = heapprofd_context_activate(ctx);
      __asm__ volatile("" ::: "memory");
      heapprofd_context_deactivate(token);
    }
    double ns = (now_ns() - t0) / pairs;
    if (ns < best) best = ns;
    printf("pair_ns=%.2f\n", ns);
  }
  printf("min_pair_ns=%.2f\n", best);
  return 0;
}
