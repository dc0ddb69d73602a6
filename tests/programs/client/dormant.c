// Allocates a little every millisecond until stdin says "go", then does a
// known workload, and exits at EOF. Used to activate the profiler with
// signal 36 while the program runs.
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void *volatile sink; // keeps the compiler from eliding malloc/free pairs

int main(void) {
  char line[64];
  size_t have = 0;
  unsigned long sum = 0;
  // The library's constructor (and its signal handler) is in place by now.
  printf("ready\n");
  fflush(stdout);
  for (;;) {
    sink = malloc(48);
    free(sink);
    struct pollfd pfd = {.fd = 0, .events = POLLIN};
    if (poll(&pfd, 1, 1) <= 0) continue;
    ssize_t n = read(0, line + have, sizeof line - 1 - have);
    if (n <= 0) break;
    have += (size_t)n;
    line[have] = 0;
    char *nl;
    while ((nl = strchr(line, '\n'))) {
      *nl = 0;
      if (strcmp(line, "go") == 0) {
        void *q[100];
        for (int i = 0; i < 100; i++) { q[i] = malloc(123456); memset(q[i], i, 8); sum += 8 * i; }
        for (int i = 0; i < 100; i++) free(q[i]);
        printf("go done sum=%lu\n", sum);
        fflush(stdout);
      }
      have -= (size_t)(nl + 1 - line);
      memmove(line, nl + 1, have + 1);
    }
  }
  printf("bye\n");
  return 0;
}
