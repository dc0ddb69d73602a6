// Allocation inside signal handlers: synchronous SIGUSR1 on a sigaltstack
// (deterministic count) and asynchronous SIGALRM from an interval timer.
// glibc's malloc is not async-signal-safe: a handler that allocates while
// the interrupted code is inside malloc or free can deadlock on the arena
// lock or corrupt the heap, with or without a profiler (a run of this
// program without any profiler was once killed by a signal on a busy
// machine). So the loop marks its malloc/free calls, and the SIGALRM
// handler allocates only outside them; inside them it just counts, which
// still interrupts the hooks at any instruction.
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
static volatile sig_atomic_t usr1, alrm, in_malloc;
static void *volatile sink; // keeps the compiler from eliding malloc/free pairs
static void on_usr1(int s) {
  (void)s;
  in_malloc = 1; // SIGALRM can interrupt this handler too
  char *p = malloc(300 + usr1 % 100);
  in_malloc = 0;
  memset(p, 1, 300);
  usr1 += p[10];
  in_malloc = 1;
  free(p);
  in_malloc = 0;
}
static void on_alrm(int s) {
  (void)s;
  if (!in_malloc) {
    sink = malloc(64);
    free(sink);
  }
  alrm++;
}
int main(void) {
  stack_t ss = {.ss_sp = malloc(1 << 16), .ss_size = 1 << 16, .ss_flags = 0};
  sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sa.sa_flags = SA_ONSTACK | SA_RESTART;
  sigaction(SIGUSR1, &sa, NULL);
  sa.sa_handler = on_alrm;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval it = {{0, 200}, {0, 200}};
  setitimer(ITIMER_REAL, &it, NULL);
  uint64_t sum = 0;
  for (int i = 0; i < 200000; i++) {
    size_t n = 1 + i % 5000;
    in_malloc = 1;
    unsigned char *p = malloc(n);
    in_malloc = 0;
    p[0] = (unsigned char)i;
    sum += p[0];
    in_malloc = 1;
    free(p);
    in_malloc = 0;
    if (i % 100 == 0) raise(SIGUSR1);
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  printf("signal usr1=%d sum=%llu alarms_seen=%d\n", (int)usr1, (unsigned long long)sum, alrm > 0);
  return 0;
}
