/* heapprofd_request_stack from real signal handlers: SIGPROF from
 * setitimer(ITIMER_PROF) every 1 ms of process CPU time, while the program
 * alternates between pure computation (busy_compute) and a malloc/free loop
 * (alloc_loop), so the handler also interrupts malloc itself (and the
 * client's hooks). The handler records the interrupted stack as event 7,
 * "prof-ticks", and counts what the call returned.
 *
 *   stack_requests ROUNDS
 *
 * prints `requests N recorded M errno_changed 0|1 not_profiling K` (M: calls
 * that returned 0, K: calls made before the profile started, -1). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "heapprofd.h"

static volatile uint64_t requests, recorded, not_profiling, sink;
static volatile int errno_changed;

static void on_prof(int sig, siginfo_t *info, void *uc) {
  (void)sig;
  (void)info;
  int before = errno;
  requests++;
  int r = heapprofd_request_stack(uc, 7);
  if (r == 0) recorded++;
  if (r == -1) not_profiling++; /* before the session started */
  if (errno != before) errno_changed = 1;
}

__attribute__((noinline)) void busy_compute(uint64_t n) {
  uint64_t x = n;
  for (uint64_t i = 0; i < n; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
  sink += x;
}

__attribute__((noinline)) void alloc_loop(int n) {
  for (int i = 0; i < n; i++) {
    char *p = malloc(64 + (i & 1023));
    if (p) {
      p[0] = (char)i;
      sink += (uint64_t)p[0];
    }
    free(p);
  }
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 200;
  if (heapprofd_register_event(7, "prof-ticks") != 0) {
    printf("register_event failed (client not loaded?)\n");
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_prof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPROF, &sa, NULL);
  struct itimerval it = {{0, 1000}, {0, 1000}};
  setitimer(ITIMER_PROF, &it, NULL);
  for (int r = 0; r < rounds; r++) {
    busy_compute(2000000);
    alloc_loop(20000);
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &off, NULL);
  /* One request outside any handler (the caller's own stack, flagged
   * biased): it also carries the losses counted since the last sample. */
  int last = heapprofd_request_stack(NULL, 7);
  requests++;
  if (last == 0) recorded++;
  printf("requests %llu recorded %llu errno_changed %d not_profiling %llu\n",
         (unsigned long long)requests, (unsigned long long)recorded, errno_changed,
         (unsigned long long)not_profiling);
  return 0;
}
