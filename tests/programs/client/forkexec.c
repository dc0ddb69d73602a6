// fork (with and without exec), vfork + exec, posix_spawn, clone(CLONE_VM),
// while another thread allocates. `forkexec child` is the exec'd image. A forked child
// that does not exec allocates blocks of FORK_CHILD_SIZE, which must never
// appear in the parent's session.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define FORK_CHILD_SIZE 777777
#define PARENT_SIZE 555555
#define CLONE_CHILD_SIZE 666666
extern char **environ;
static volatile int stop;
// Keep the compiler from eliding malloc/free pairs; one per thread.
static void *volatile sink_bg, *volatile sink;

static void *bg(void *arg) {
  (void)arg;
  while (!stop) { sink_bg = malloc(100); free(sink_bg); }
  return NULL;
}

// A clone(CLONE_VM) child: another process sharing our memory (and, without
// CLONE_SETTLS, this thread's TLS). Its allocations are made in our heap, so
// they are recorded in our session (as a vfork child's would be), each with
// its free. The parent waits for it without allocating.
static int clone_child(void *arg) {
  (void)arg;
  for (int j = 0; j < 100; j++) { sink = malloc(CLONE_CHILD_SIZE); free(sink); }
  return 0;
}

static int wait_ok(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return 0;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "child") == 0) {
    char *s = malloc(64);
    strcpy(s, "child");
    int ok = strlen(s) == 5;
    free(s);
    return ok ? 0 : 1;
  }
  pthread_t t;
  pthread_create(&t, NULL, bg, NULL);
  int ok_fork = 1, ok_forkexec = 1, ok_vfork = 1, ok_spawn = 1, ok_clone = 1;
  static char clone_stack[1 << 16] __attribute__((aligned(16)));
  for (int i = 0; i < 5; i++) {
    pid_t p = fork();
    if (p == 0) {
      for (int j = 0; j < 1000; j++) { sink = malloc(FORK_CHILD_SIZE); free(sink); }
      _exit(0);
    }
    ok_fork &= wait_ok(p);
    p = fork();
    if (p == 0) { execl(argv[0], argv[0], "child", (char *)NULL); _exit(127); }
    ok_forkexec &= wait_ok(p);
    p = vfork();
    if (p == 0) { execl(argv[0], argv[0], "child", (char *)NULL); _exit(127); }
    ok_vfork &= wait_ok(p);
    char *args[] = {argv[0], "child", NULL};
    pid_t sp;
    ok_spawn &= posix_spawn(&sp, argv[0], NULL, NULL, args, environ) == 0 && wait_ok(sp);
    p = clone(clone_child, clone_stack + sizeof clone_stack, CLONE_VM | SIGCHLD, NULL);
    ok_clone &= p > 0 && wait_ok(p);
    sink = malloc(PARENT_SIZE + i);
    free(sink);
  }
  stop = 1;
  pthread_join(t, NULL);
  printf("fork=%d forkexec=%d vfork=%d spawn=%d clone=%d\n", ok_fork, ok_forkexec, ok_vfork, ok_spawn,
         ok_clone);
  return 0;
}
