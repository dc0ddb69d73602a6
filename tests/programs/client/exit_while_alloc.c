// exit() while other threads are still allocating.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void *volatile sink[9]; // keeps the compiler from eliding the calls
static void *spin(void *arg) {
  size_t n = (size_t)arg;
  for (;;) { sink[n / 100] = malloc(n); sink[n / 100] = realloc(sink[n / 100], n * 3); free(sink[n / 100]); }
  return NULL;
}
int main(void) {
  pthread_t t;
  for (size_t i = 1; i <= 8; i++) pthread_create(&t, NULL, spin, (void *)(i * 100));
  unsigned long sum = 0;
  for (int i = 0; i < 100000; i++) { char *p = malloc(32); p[0] = (char)i; sum += (unsigned char)p[0]; free(p); }
  printf("exit sum=%lu\n", sum);
  fflush(stdout);
  exit(0);
}
