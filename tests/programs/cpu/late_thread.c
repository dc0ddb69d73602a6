/* A target for `record --pid --cpu-time` (tests/tests/cpu_time.rs): a
 * single-threaded program (a heap-only attach would give it a synchronous
 * session, without a client thread) that starts a thread only when asked,
 * after the attach. Prints "ready", then reads commands on stdin:
 *
 *   burn MS   start a thread that burns MS ms of its own CPU time in
 *             late_spin() and join it; answers "burned TID NS" (the
 *             thread's id and the CPU time it used)
 *   quit      answers "bye" and exits */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;

struct burn {
  uint64_t want_ns, used_ns;
  pid_t tid;
};

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) static uint64_t late_spin(uint64_t x) {
  for (int i = 0; i < 100000; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}

static void *burner(void *arg) {
  struct burn *b = arg;
  b->tid = gettid();
  uint64_t start = thread_cpu_ns(), x = 1;
  while (thread_cpu_ns() - start < b->want_ns) sink = x = late_spin(x);
  b->used_ns = thread_cpu_ns() - start;
  return NULL;
}

int main(void) {
  char line[128];
  printf("ready\n");
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {
    unsigned ms;
    if (sscanf(line, "burn %u", &ms) == 1) {
      struct burn b = {(uint64_t)ms * 1000000ull, 0, 0};
      pthread_t t;
      if (pthread_create(&t, NULL, burner, &b) != 0 || pthread_join(t, NULL) != 0) return 1;
      printf("burned %d %llu\n", (int)b.tid, (unsigned long long)b.used_ns);
    } else if (strncmp(line, "quit", 4) == 0) {
      printf("bye\n");
      return 0;
    } else {
      printf("unknown command\n");
    }
    fflush(stdout);
  }
  return 0;
}
