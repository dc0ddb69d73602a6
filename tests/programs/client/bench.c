// Allocation benchmark (the peer-profilers reference workload):
//   bench THREADS PAIRS_PER_THREAD DEPTH [STACK_KIB [split]]
// Each thread makes PAIRS malloc/free pairs of random sizes 16..4096
// (xorshift), at call depth DEPTH (non-inlined recursion); every 8th block is
// kept in a 1024-entry ring instead of freed at once, so lifetimes vary.
// STACK_KIB > 0 pads the stack below the leaf so that about that many KiB
// of stack are live at each allocation. Prints the time from thread
// creation to join (inner_ns) and the worker threads' summed CPU time
// (cpu_ns, insensitive to preemption by other processes).
// "split": instead of pairs, each thread makes PAIRS allocations, then frees
// them all, and reports the CPU time of the two phases separately
// (alloc_cpu_ns, free_cpu_ns), to tell the cost of a sample from the cost
// of recording its free.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long pairs, depth, stack_kib;
static int split;

static long long thread_cpu_ns(void) {
  struct timespec c;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c);
  return c.tv_sec * 1000000000LL + c.tv_nsec;
}

struct state {
  uint64_t rng; void *keep[1024]; unsigned k; uint64_t sum; long long cpu_ns;
  void **all; long long alloc_ns, free_ns;
};

__attribute__((noinline)) static void leaf(struct state *s) {
  if (split) {
    long long t0 = thread_cpu_ns();
    for (long i = 0; i < pairs; i++) {
      s->rng ^= s->rng << 13; s->rng ^= s->rng >> 7; s->rng ^= s->rng << 17;
      char *p = malloc(16 + s->rng % 4081);
      p[0] = (char)i;
      s->all[i] = p;
    }
    long long t1 = thread_cpu_ns();
    for (long i = 0; i < pairs; i++) { s->sum += (unsigned char)((char *)s->all[i])[0]; free(s->all[i]); }
    long long t2 = thread_cpu_ns();
    s->alloc_ns = t1 - t0;
    s->free_ns = t2 - t1;
    return;
  }
  for (long i = 0; i < pairs; i++) {
    s->rng ^= s->rng << 13; s->rng ^= s->rng >> 7; s->rng ^= s->rng << 17;
    size_t n = 16 + s->rng % 4081;
    char *p = malloc(n);
    p[0] = (char)i;
    s->sum += (unsigned char)p[0];
    if ((s->rng >> 20) % 8 == 0) {
      unsigned k = s->k++ % 1024;
      free(s->keep[k]);
      s->keep[k] = p;
    } else {
      free(p);
    }
  }
}

__attribute__((noinline)) static void pad(struct state *s, long kib) {
  volatile char buf[kib > 0 ? kib * 1024 : 1];
  buf[0] = 1;
  leaf(s);
  __asm__ volatile("" ::"r"(buf) : "memory");
}

__attribute__((noinline)) static void chain(struct state *s, long d) {
  if (d <= 0) { pad(s, stack_kib); return; }
  chain(s, d - 1);
  __asm__ volatile("" ::: "memory"); // not a tail call
}

static void *thread_main(void *arg) {
  struct state *s = calloc(1, sizeof *s);
  s->rng = 0x9E3779B97F4A7C15ull * ((uintptr_t)arg + 1);
  if (split) s->all = calloc((size_t)pairs, sizeof(void *));
  chain(s, depth);
  free(s->all);
  for (int i = 0; i < 1024; i++) free(s->keep[i]);
  struct timespec c;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c);
  s->cpu_ns = c.tv_sec * 1000000000LL + c.tv_nsec;
  (void)thread_cpu_ns;
  return s;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  pairs = argc > 2 ? atol(argv[2]) : 2000000;
  depth = argc > 3 ? atol(argv[3]) : 20;
  stack_kib = argc > 4 ? atol(argv[4]) : 0;
  split = argc > 5 && strcmp(argv[5], "split") == 0;
  pthread_t t[64];
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, thread_main, (void *)(uintptr_t)i);
  uint64_t sum = 0;
  long long cpu = 0, alloc_ns = 0, free_ns = 0;
  for (int i = 0; i < threads; i++) {
    void *v;
    pthread_join(t[i], &v);
    struct state *s = v;
    sum += s->sum;
    cpu += s->cpu_ns;
    alloc_ns += s->alloc_ns;
    free_ns += s->free_ns;
    free(s);
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  long long ns = (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
  printf("inner_ns=%lld cpu_ns=%lld alloc_cpu_ns=%lld free_cpu_ns=%lld pairs=%ld threads=%d sum=%llu\n",
         ns, cpu, alloc_ns, free_ns, pairs, threads, (unsigned long long)sum);
  return 0;
}
