// Loads the client library with dlopen (as an attach would) instead of
// LD_PRELOAD, and calls its malloc/free directly from the main thread and a
// new thread: its initial-exec TLS block must fit in glibc's static TLS
// surplus, and its constructor must start the session.
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *(*hp_malloc)(size_t);
static void (*hp_free)(void *);

static void *work(void *arg) {
  unsigned long sum = 0;
  for (int i = 0; i < 1000; i++) {
    unsigned char *p = hp_malloc(100 + i);
    memset(p, i & 0xff, 100 + i);
    sum += p[i];
    hp_free(p);
  }
  *(unsigned long *)arg = sum;
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  hp_malloc = (void *(*)(size_t))dlsym(h, "malloc");
  hp_free = (void (*)(void *))dlsym(h, "free");
  if (!hp_malloc || !hp_free) return 1;
  unsigned long a = 0, b = 0;
  work(&a);
  pthread_t t;
  pthread_create(&t, NULL, work, &b);
  pthread_join(t, NULL);
  printf("dlopen_client sums=%lu,%lu\n", a, b);
  return 0;
}
