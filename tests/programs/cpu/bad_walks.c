/* heapprofd_request_stack with a context the daemon cannot walk
 * (tests/tests/cpu_time.rs): its pc is 0x40, in no mapping, so the remote
 * unwind fails at once (INVALID_MAP); each such sample must still be
 * written, with its PerfSample unwind_error, and counted. Event 9,
 * "bad-walks", gets N of them and N (+1) good ones (getcontext's own).
 *
 *   bad_walks N   prints "bad B good G" (calls that returned 0) */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>
#include <unistd.h>

#include "heapprofd.h"

#define TAG 9

__attribute__((noinline)) static int good_request(void) {
  ucontext_t uc;
  getcontext(&uc);
  return heapprofd_request_stack(&uc, TAG);
}

__attribute__((noinline)) static int bad_request(void) {
  ucontext_t uc;
  getcontext(&uc);
#if defined(__x86_64__)
  uc.uc_mcontext.gregs[REG_RIP] = 0x40;
#elif defined(__aarch64__)
  uc.uc_mcontext.pc = 0x40;
#endif
  return heapprofd_request_stack(&uc, TAG);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 10;
  if (heapprofd_register_event(TAG, "bad-walks") != 0) return 1;
  /* The profile may start after main: wait for the first recorded sample
   * (bounded: 20 s). */
  int good = 0, bad = 0;
  for (int i = 0; i < 20000 && !good; i++) {
    good = good_request() == 0;
    if (!good) usleep(1000);
  }
  for (int i = 0; i < n; i++) {
    bad += bad_request() == 0;
    good += good_request() == 0;
  }
  printf("bad %d good %d\n", bad, good);
  return 0;
}
