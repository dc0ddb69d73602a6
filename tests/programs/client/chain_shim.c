// A preloaded malloc shim that forwards every call to the next definition
// with dlsym(RTLD_NEXT, ...), as heaptrack's preload, glibc's
// libmemusage.so and the emulated bionic libc of tests/programs/bionic do.
// In LD_PRELOAD before the client (the order `LD_PRELOAD` + the client
// installed in /etc/ld.so.preload gives), RTLD_NEXT is the client's hook,
// which must forward onwards (to glibc), never back to this shim.
//
// It counts the calls it forwarded and prints `chain_shim: N calls` on
// stderr at exit, so a test sees the program's calls went through it.
// The count is taken after the call (no tail call): a loop between the
// shim and the client overflows the stack at once instead of spinning.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

static void *(*next_malloc)(size_t);
static void (*next_free)(void *);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static unsigned long calls;

// While dlsym runs (it may allocate), allocations come from here.
static char early[4096] __attribute__((aligned(16)));
static size_t early_used;
static int resolving;

static void *early_alloc(size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (early_used + n > sizeof early) return NULL;
  void *p = early + early_used;
  early_used += n;
  return p;
}

static int is_early(void *p) {
  return (char *)p >= early && (char *)p < early + sizeof early;
}

static void resolve(void) {
  if (next_malloc || resolving) return;
  resolving = 1;
  next_free = dlsym(RTLD_NEXT, "free");
  next_calloc = dlsym(RTLD_NEXT, "calloc");
  next_realloc = dlsym(RTLD_NEXT, "realloc");
  next_malloc = dlsym(RTLD_NEXT, "malloc");
  resolving = 0;
}

void *malloc(size_t n) {
  resolve();
  if (!next_malloc) return early_alloc(n);
  void *p = next_malloc(n);
  __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
  return p;
}

void *calloc(size_t a, size_t b) {
  resolve();
  if (!next_calloc) return early_alloc(a * b);  // zeroed: static storage
  void *p = next_calloc(a, b);
  __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
  return p;
}

void *realloc(void *old, size_t n) {
  resolve();
  if (is_early(old) || !next_realloc) return NULL;
  void *p = next_realloc(old, n);
  __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
  return p;
}

void free(void *p) {
  if (is_early(p)) return;
  resolve();
  if (!next_free) return;
  next_free(p);
  __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
}

__attribute__((destructor)) static void report(void) {
  char buf[64];
  int n = snprintf(buf, sizeof buf, "chain_shim: %lu calls\n",
                   __atomic_load_n(&calls, __ATOMIC_RELAXED));
  if (n > 0) (void)write(2, buf, (size_t)n);
}
