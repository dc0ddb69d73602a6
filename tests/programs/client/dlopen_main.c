// dlopen/dlclose a library that allocates and uses TLS, from 4 threads.
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
static const char *lib;
static void *worker(void *arg) {
  uint64_t sum = 0;
  for (int i = 0; i < 50; i++) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); abort(); }
    unsigned long (*f)(unsigned long) = (unsigned long (*)(unsigned long))dlsym(h, "dl_work");
    sum += f((uintptr_t)arg + i);
    dlclose(h);
  }
  return (void *)(uintptr_t)sum;
}
int main(int argc, char **argv) {
  lib = argc > 1 ? argv[1] : "./libdlalloc.so";
  pthread_t t[4];
  uint64_t total = 0;
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
  for (int i = 0; i < 4; i++) { void *v; pthread_join(t[i], &v); total += (uint64_t)(uintptr_t)v; }
  printf("dlopen checksum=%llu\n", (unsigned long long)total);
  return 0;
}
