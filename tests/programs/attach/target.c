// A long-running C target for `record --pid` tests (tests/tests/attach_e2e.rs).
//
// Usage: target THREADS. Starts THREADS worker threads that allocate and
// free in a loop (in c_worker_alloc), prints "ready", then reads commands
// from stdin, one per line, answering each on stdout:
//   work N       deterministic allocation-heavy computation in c_target_work;
//                prints "sum=<checksum>" (the same value with or without a
//                profiler attached)
//   got          "malloc=libc" if the program's GOT entry for malloc holds
//                glibc's malloc, "malloc=other" if something else (a
//                profiler's hook)
//   keep N       allocates N blocks of 1000 bytes in c_prealloc and keeps them
//   drop         frees the blocks of `keep`; prints "dropped N"
//   plugin PATH N  dlopen(PATH) (the name as given), then calls its
//                plugin_alloc(N) until its own GOT entry for malloc is not
//                glibc's (the profiler patched it), then N more times;
//                prints "plugin patched" (or "plugin unpatched" after 60 s)
//   plugin-state PATH  for a plugin loaded before: "plugin-state patched" or
//                "plugin-state clean" (its GOT entry for malloc is glibc's)
//   unplug PATH  dlclose a plugin loaded before (it is unmapped); prints
//                "unplugged" or "unplug error" 
//   single       "single=1" while glibc considers the process single-threaded
//                (__libc_single_threaded), "single=0" once a thread was created
//   quit         stops the workers and exits 0
// With THREADS = 0 the only thread blocks in read(2) on stdin between
// commands (the "target blocked in a system call" case).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/single_threaded.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;

__attribute__((noinline)) static void *c_worker_alloc(size_t n) {
  char *p = malloc(n);
  if (p) memset(p, (int)n, n);
  return p;
}

static void *worker(void *arg) {
  (void)arg;
  void *keep[32] = {0};
  unsigned long it = 0;
  while (!stop) {
    int k = it % 32;
    free(keep[k]);
    keep[k] = c_worker_alloc(64 + (it * 97) % 8000);
    if (++it % 64 == 0) {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
  }
  for (int i = 0; i < 32; i++) free(keep[i]);
  return NULL;
}

struct node {
  struct node *next;
  uint64_t v;
  char pad[40];
};

__attribute__((noinline)) static uint64_t c_target_work(long n) {
  struct node *head = NULL;
  uint64_t x = 88172645463325252ull, sum = 0;
  for (long i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    struct node *e = malloc(sizeof *e);
    e->v = x;
    e->next = head;
    head = e;
    char *s = malloc(16 + x % 200);
    memset(s, (int)(x & 0xff), 16 + x % 200);
    sum = sum * 31 + (unsigned char)s[7];
    free(s);
  }
  while (head) {
    struct node *n2 = head->next;
    sum += head->v;
    free(head);
    head = n2;
  }
  return sum;
}

static void **kept;
static long nkept;

__attribute__((noinline)) static void c_prealloc(long n) {
  kept = calloc(n, sizeof *kept);
  for (long i = 0; i < n; i++) kept[i] = malloc(1000);
  nkept = n;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2;
  pthread_t t[64];
  for (int i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, worker, NULL);
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("ready\n");
  char line[4096];
  while (fgets(line, sizeof line, stdin)) {
    line[strcspn(line, "\n")] = 0;
    if (!strncmp(line, "work ", 5)) {
      printf("sum=%llu\n", (unsigned long long)c_target_work(atol(line + 5)));
    } else if (!strcmp(line, "got")) {
      void *(*volatile m)(size_t) = malloc;
      void *libc = dlsym(RTLD_DEFAULT, "malloc");
      printf("malloc=%s\n", (void *)m == libc ? "libc" : "other");
    } else if (!strncmp(line, "keep ", 5)) {
      c_prealloc(atol(line + 5));
      printf("kept %ld\n", nkept);
    } else if (!strcmp(line, "drop")) {
      for (long i = 0; i < nkept; i++) free(kept[i]);
      free(kept);
      printf("dropped %ld\n", nkept);
      nkept = 0;
    } else if (!strncmp(line, "unplug ", 7)) {
      void *h = dlopen(line + 7, RTLD_NOW | RTLD_NOLOAD);
      // Our reference and the one from `plugin`.
      int rc = h ? dlclose(h) | dlclose(h) : -1;
      printf("%s\n", rc == 0 ? "unplugged" : "unplug error");
    } else if (!strncmp(line, "plugin-state ", 13)) {
      void *h = dlopen(line + 13, RTLD_NOW | RTLD_NOLOAD);
      int (*patched)(void) = h ? (int (*)(void))dlsym(h, "plugin_malloc_patched") : NULL;
      printf("plugin-state %s\n", !patched ? "unloaded" : patched() ? "patched" : "clean");
    } else if (!strncmp(line, "plugin ", 7)) {
      char *path = line + 7, *sp = strrchr(path, ' ');
      long n = sp ? atol(sp + 1) : 1000;
      if (sp) *sp = 0;
      void *h = dlopen(path, RTLD_NOW);
      if (!h) {
        printf("plugin error %s\n", dlerror());
        continue;
      }
      void *(*alloc)(size_t) = (void *(*)(size_t))dlsym(h, "plugin_alloc");
      int (*patched)(void) = (int (*)(void))dlsym(h, "plugin_malloc_patched");
      time_t start = time(NULL);
      int ok = 0;
      while (time(NULL) - start < 60) {
        free(alloc(100));
        // The program keeps allocating meanwhile (its own calls are sampled).
        void *q = malloc(4096);
        __asm__ volatile("" ::"r"(q) : "memory");
        free(q);
        if (patched()) {
          ok = 1;
          break;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
      }
      for (long i = 0; ok && i < n; i++) free(alloc(100 + i % 100));
      printf("plugin %s\n", ok ? "patched" : "unpatched");
    } else if (!strcmp(line, "single")) {
      printf("single=%d\n", (int)__libc_single_threaded);
    } else if (!strcmp(line, "quit")) {
      break;
    } else {
      printf("unknown %s\n", line);
    }
  }
  stop = 1;
  for (int i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
  printf("bye\n");
  return 0;
}
