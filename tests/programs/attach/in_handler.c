// A target that is never at a safe point: its only thread sits inside a
// signal handler (it raises SIGUSR1 and the handler waits in pause()), so
// the attach keeps refusing it. Prints "ready" from the handler. SIGTERM
// (default action) ends it.
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static void on_usr1(int sig) {
  (void)sig;
  printf("ready\n");
  fflush(stdout);
  for (;;) pause();
}

int main(void) {
  signal(SIGUSR1, on_usr1);
  raise(SIGUSR1);
  return 0;
}
