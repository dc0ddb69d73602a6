// A library the attach tests load into a target after the attach
// (target.c's `plugin` command): its malloc calls must be profiled too.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

__attribute__((noinline)) void *plugin_alloc(size_t n) {
  void *p = malloc(n);
  __asm__ volatile("" ::"r"(p) : "memory");
  return p;
}

// Whether this library's GOT entry for malloc no longer holds glibc's
// malloc (the profiler patched it).
int plugin_malloc_patched(void) {
  void *(*volatile m)(size_t) = malloc;
  return (void *)m != dlsym(RTLD_DEFAULT, "malloc");
}
