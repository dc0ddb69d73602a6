/* The cost of one stack sample from a signal handler, for
 * scripts/bench-cpu-time.sh: 20000 SIGUSR1s sent to this thread (tgkill),
 * each handler calling heapprofd_request_stack(ucontext, 7), 2 ms of rest
 * every 256 so the daemon keeps up; prints the process CPU time per
 * signal, `per_signal_us X recorded N of 20000`. Bare (no client: the
 * request returns at once) it is the signal's own cost; under `record` the
 * difference is the sample's. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "heapprofd.h"
static volatile uint64_t recorded;
static void on_usr1(int s, siginfo_t *i, void *uc) { (void)s; (void)i; if (heapprofd_request_stack(uc, 7) == 0) recorded++; }
static double cpu_us(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__attribute__((noinline)) static void level3(int n) { pid_t p = getpid(); pid_t t = syscall(SYS_gettid); for (int i = 0; i < n; i++) { syscall(SYS_tgkill, p, t, SIGUSR1); if ((i & 255) == 255) usleep(2000); } }
__attribute__((noinline)) static void level2(int n) { level3(n); }
int main(int argc, char **argv) {
  int n = 20000;
  heapprofd_register_event(7, "bench");
  usleep(300000);
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_sigaction = on_usr1; sa.sa_flags = SA_SIGINFO | SA_RESTART; sigaction(SIGUSR1, &sa, NULL);
  double t0 = cpu_us(); level2(n); double t1 = cpu_us();
  printf("per_signal_us %.2f recorded %llu of %d\n", (t1 - t0) / n, (unsigned long long)recorded, n);
  return 0;
}
