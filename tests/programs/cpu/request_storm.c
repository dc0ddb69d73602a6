/* heapprofd_request_stack from real SIGPROF handlers, a million times
 * (docs/PERFORMANCE.md, run by hand: not in the tests). The main thread
 * loops on malloc/free (alloc_loop), so handlers interrupt malloc itself
 * and the client's hooks; SIGPROF comes from setitimer(ITIMER_PROF, 1 ms)
 * (to either thread) and from a second thread that sends it to the main
 * thread with tgkill, one at a time (it waits for a handler to run before
 * the next), until N requests were made. The handler records event 7, "storm".
 *
 *   request_storm N
 *
 * prints `requests R recorded M reentered I dropped D not_profiling K
 * errno_changed 0|1` (I: the thread was inside the client, D: the buffer
 * was full, both counted as lost samples of the thread; K: calls before
 * the profile started). A crash or a deadlock never prints. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include "heapprofd.h"

static volatile uint64_t requests, recorded, reentered, dropped, not_profiling, sink;
static volatile int errno_changed, done;
static uint64_t target;
static pid_t main_tid;

static void on_prof(int sig, siginfo_t *info, void *uc) {
  (void)sig;
  (void)info;
  int before = errno;
  int r = heapprofd_request_stack(uc, 7);
  /* Atomic: the timer's SIGPROF also lands on the sender thread. */
  volatile uint64_t *c = r == 0    ? &recorded
                         : r == -1 ? &not_profiling
                         : r == -2 ? &reentered
                                   : &dropped;
  __atomic_add_fetch(c, 1, __ATOMIC_RELAXED);
  if (errno != before) errno_changed = 1;
  __atomic_add_fetch(&requests, 1, __ATOMIC_RELEASE);
}

static void *sender(void *arg) {
  (void)arg;
  while (__atomic_load_n(&requests, __ATOMIC_ACQUIRE) < target) {
    uint64_t seen = __atomic_load_n(&requests, __ATOMIC_ACQUIRE);
    syscall(SYS_tgkill, getpid(), main_tid, SIGPROF);
    while (__atomic_load_n(&requests, __ATOMIC_ACQUIRE) == seen) sched_yield();
  }
  done = 1;
  return NULL;
}

__attribute__((noinline)) static void alloc_loop(int n) {
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
  target = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
  if (heapprofd_register_event(7, "storm") != 0) printf("register_event failed\n");
  main_tid = (pid_t)syscall(SYS_gettid);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_prof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPROF, &sa, NULL);
  struct itimerval it = {{0, 1000}, {0, 1000}};
  setitimer(ITIMER_PROF, &it, NULL);
  pthread_t t;
  if (pthread_create(&t, NULL, sender, NULL) != 0) return 1;
  while (!done) alloc_loop(1000);
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &off, NULL);
  pthread_join(t, NULL);
  printf("requests %llu recorded %llu reentered %llu dropped %llu not_profiling %llu "
         "errno_changed %d\n",
         (unsigned long long)requests, (unsigned long long)recorded,
         (unsigned long long)reentered, (unsigned long long)dropped,
         (unsigned long long)not_profiling, errno_changed);
  return 0;
}
