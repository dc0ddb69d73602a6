// Prints "ready" and waits for stdin to close. Built statically (and as an
// ordinary program) for the attach error tests.
#include <stdio.h>
#include <unistd.h>

int main(void) {
  char c;
  printf("ready\n");
  fflush(stdout);
  while (read(0, &c, 1) > 0) {
  }
  return 0;
}
