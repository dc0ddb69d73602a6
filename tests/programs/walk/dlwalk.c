/* A library dlopened after heapprofd_walk_prepare, walked from inside
 * (tests/tests/stack_walk.rs). Built -O2 -fomit-frame-pointer -rdynamic.
 *   dlwalk LIB [reprepare]
 * prepares the walk API, dlopens LIB (a path, or a bare name searched
 * like any dlopen), calls its dlwalk_outer -> dlwalk_inner, which calls
 * back walk_here, which walks its own stack (NULL context); prints "FRAME type pc name" lines (names
 * by dladdr) and "END" or "FAIL reason". With "reprepare" the program
 * calls heapprofd_walk_prepare again after the dlopen. Exit 2 if LIB did
 * not load. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <heapprofd.h>
#include <stdio.h>
#include <string.h>

#define MAX 64
static uint64_t pcs[MAX];
static int types[MAX];
static int frames, ended, reason = -1;

static void on_frame(int type, uint64_t pc, void *user) {
  (void)user;
  if (frames < MAX) {
    types[frames] = type;
    pcs[frames++] = pc;
  }
}
static void on_end(uint64_t thread, void *user) {
  (void)thread, (void)user;
  ended = 1;
}
static void on_failure(uint64_t thread, int r, void *user) {
  (void)thread, (void)user;
  reason = r;
}
static const struct heapprofd_stack_callbacks cb = {NULL, on_frame, on_end, on_failure};

__attribute__((noinline)) int walk_here(void) {
  int rc = heapprofd_walk_stack(NULL, &cb, NULL);
  __asm__ volatile("" ::: "memory"); /* not a tail call */
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  if (heapprofd_walk_prepare() != 0) {
    puts("NOT PREPARED");
    return 1;
  }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    printf("DLOPEN FAILED %s\n", dlerror());
    return 2;
  }
  if (argc > 2 && !strcmp(argv[2], "reprepare")) heapprofd_walk_prepare();
  int (*outer)(int (*)(void)) = (int (*)(int (*)(void)))dlsym(h, "dlwalk_outer");
  if (!outer) return 2;
  int rc = outer(walk_here);
  for (int i = 0; i < frames; i++) {
    Dl_info info;
    /* A return address names its call: look up the byte before it. */
    uint64_t at = i == 0 ? pcs[i] : pcs[i] - 1;
    const char *name = dladdr((void *)at, &info) && info.dli_sname ? info.dli_sname : "?";
    printf("FRAME %d %llx %s\n", types[i], (unsigned long long)pcs[i], name);
  }
  if (ended)
    puts("END");
  else
    printf("FAIL %d\n", reason);
  printf("RC %d\n", rc);
  return 0;
}
