// emulated_libc.so: an emulated bionic malloc layer for glibc, preloaded
// into a real program, so heapprofd-rs's bionic front-end
// (libheapprofd_bionic.so) is loaded and driven the way bionic's libc does
// it (libc/bionic/malloc_common_dynamic.cpp and malloc_heapprofd.cpp, AOSP
// platform_bionic 731631f; behaviour re-implemented, no code copied):
//
// * malloc, free, calloc, realloc, memalign, posix_memalign, aligned_alloc,
//   malloc_usable_size, valloc, pvalloc call through the current dispatch
//   table if one is installed, else glibc's allocator (the "native" one);
// * start-up (the constructor; bionic: the heapprofd.enable properties,
//   here their stand-in HEAPPROFD_EMU_ENABLE=1): load the library named by
//   HEAPPROFD_EMU_CLIENT with dlopen(RTLD_NOW | RTLD_LOCAL), dlsym every
//   heapprofd_<name> (one missing: the name on stderr, exit 97), call
//   heapprofd_initialize with the native table (glibc's functions), and on
//   true swap in the table of the library's functions atomically and
//   register heapprofd_finalize with __cxa_atexit;
// * the profiling signal, __SIGRTMIN + 4 (36) sent with sigqueue and value
//   0: the handler only marks it; the next malloc takes heapprofd's table
//   out (allocations go to the native table meanwhile) and starts a thread
//   named "heapprofdinit" that loads (or re-uses) the library, looks every
//   name up again and initializes again: a new session.
//
// Each successful initialize appends "initialize ok" (and a failed one
// "initialize failed") to the file HEAPPROFD_EMU_LOG, if set, so a test can
// wait for it. HEAPPROFD_EMU_SELFTEST=1: after loading, call every entry of
// the library's table once and check that each reached its slot of the
// native table (counters), print "selftest: N entries forwarded" and exit
// 0, or name the entry that did not and exit 98 (no daemon needed: the
// library's functions are called directly, whatever initialize returned).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern int __cxa_atexit(void (*)(void *), void *, void *);

// bionic's MallocDispatch on LP64 (no pvalloc/valloc slots), aligned(32).
struct bionic_mallinfo { size_t f[10]; };
typedef struct {
  void *(*calloc)(size_t, size_t);
  void (*free)(void *);
  struct bionic_mallinfo (*mallinfo)(void);
  void *(*malloc)(size_t);
  size_t (*malloc_usable_size)(const void *);
  void *(*memalign)(size_t, size_t);
  int (*posix_memalign)(void **, size_t, size_t);
  void *(*realloc)(void *, size_t);
  int (*malloc_iterate)(uintptr_t, size_t, void (*)(uintptr_t, size_t, void *), void *);
  void (*malloc_disable)(void);
  void (*malloc_enable)(void);
  int (*mallopt)(int, int);
  void *(*aligned_alloc)(size_t, size_t);
  int (*malloc_info)(int, FILE *);
} __attribute__((aligned(32))) MallocDispatch;
_Static_assert(sizeof(MallocDispatch) == 128, "bionic's LP64 MallocDispatch");

// ---- the native table: glibc's functions, each counting its calls ----
enum { N_CALLOC, N_FREE, N_MALLINFO, N_MALLOC, N_USABLE, N_MEMALIGN, N_POSIX, N_REALLOC,
       N_ITERATE, N_DISABLE, N_ENABLE, N_MALLOPT, N_ALIGNED, N_INFO, N_SLOTS };
static atomic_long calls[N_SLOTS];
static size_t (*glibc_usable)(void *);
static int (*glibc_posix_memalign)(void **, size_t, size_t);
static void *(*glibc_aligned_alloc)(size_t, size_t);

#define COUNT(n) atomic_fetch_add_explicit(&calls[n], 1, memory_order_relaxed)
static void *n_calloc(size_t a, size_t b) { COUNT(N_CALLOC); return __libc_calloc(a, b); }
static void n_free(void *p) { COUNT(N_FREE); __libc_free(p); }
static struct bionic_mallinfo n_mallinfo(void) {
  COUNT(N_MALLINFO);
  struct mallinfo2 m = mallinfo2();  // size_t fields, bionic's layout
  struct bionic_mallinfo r;
  memcpy(&r, &m, sizeof r);
  return r;
}
static void *n_malloc(size_t n) { COUNT(N_MALLOC); return __libc_malloc(n); }
static size_t n_usable(const void *p) { COUNT(N_USABLE); return glibc_usable((void *)p); }
static void *n_memalign(size_t a, size_t n) { COUNT(N_MEMALIGN); return __libc_memalign(a, n); }
static int n_posix(void **o, size_t a, size_t n) { COUNT(N_POSIX); return glibc_posix_memalign(o, a, n); }
static void *n_realloc(void *p, size_t n) { COUNT(N_REALLOC); return __libc_realloc(p, n); }
static int n_iterate(uintptr_t b, size_t s, void (*cb)(uintptr_t, size_t, void *), void *arg) {
  (void)b; (void)s; (void)cb; (void)arg;
  COUNT(N_ITERATE);
  return -1;  // glibc cannot walk its heap
}
static void n_disable(void) { COUNT(N_DISABLE); }
static void n_enable(void) { COUNT(N_ENABLE); }
static int n_mallopt(int p, int v) { COUNT(N_MALLOPT); return mallopt(p, v); }
static void *n_aligned(size_t a, size_t n) { COUNT(N_ALIGNED); return glibc_aligned_alloc(a, n); }
static int n_info(int o, FILE *f) { COUNT(N_INFO); return malloc_info(o, f); }

static const MallocDispatch native = {
  n_calloc, n_free, n_mallinfo, n_malloc, n_usable, n_memalign, n_posix, n_realloc,
  n_iterate, n_disable, n_enable, n_mallopt, n_aligned, n_info,
};

// ---- the dispatch table in use (bionic: globals->current_dispatch_table) ----
static MallocDispatch hooks;  // filled from the library's functions
static _Atomic(const MallocDispatch *) current;
static atomic_int signal_pending;
static void *handle;
typedef bool (*init_fn)(const MallocDispatch *, bool *, const char *);
static init_fn initialize;
static void (*finalize)(void);
static bool zygote_child;

static void emu_log(const char *line) {
  const char *path = getenv("HEAPPROFD_EMU_LOG");
  if (!path) return;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!write(fd, line, strlen(line));
  close(fd);
}

static void *need(const char *name) {
  char symbol[128];
  snprintf(symbol, sizeof symbol, "heapprofd_%s", name);
  void *f = dlsym(handle, symbol);
  if (!f) {
    fprintf(stderr, "emulated bionic: dlsym(\"%s\") failed\n", symbol);
    _exit(97);
  }
  return f;
}

// bionic's InitSharedLibrary + InitMallocFunctions: every name, or nothing.
static void look_up_all(void) {
  static const char *control[] = {"initialize", "finalize", "get_malloc_leak_info",
                                  "free_malloc_leak_info", "malloc_backtrace",
                                  "write_malloc_leak_info"};
  for (size_t i = 0; i < sizeof control / sizeof *control; i++) need(control[i]);
  initialize = (init_fn)need("initialize");
  finalize = (void (*)(void))need("finalize");
  hooks.free = need("free");
  hooks.calloc = need("calloc");
  hooks.mallinfo = need("mallinfo");
  hooks.mallopt = need("mallopt");
  hooks.malloc = need("malloc");
  hooks.malloc_info = need("malloc_info");
  hooks.malloc_usable_size = need("malloc_usable_size");
  hooks.memalign = need("memalign");
  hooks.posix_memalign = need("posix_memalign");
  hooks.aligned_alloc = need("aligned_alloc");
  hooks.realloc = need("realloc");
  hooks.malloc_iterate = need("malloc_iterate");
  hooks.malloc_disable = need("malloc_disable");
  hooks.malloc_enable = need("malloc_enable");
}

static void finalize_at_exit(void *arg) {
  (void)arg;
  finalize();
}

// bionic's LoadSharedLibrary (or the kept handle) + FinishInstallHooks.
static bool install_hooks(void) {
  if (!handle) {
    const char *lib = getenv("HEAPPROFD_EMU_CLIENT");
    handle = lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!handle) {
      fprintf(stderr, "emulated bionic: dlopen failed: %s\n", lib ? dlerror() : "no HEAPPROFD_EMU_CLIENT");
      return false;
    }
    look_up_all();
    if (!initialize(&native, &zygote_child, NULL)) {
      emu_log("initialize failed\n");
      return false;
    }
    __cxa_atexit(finalize_at_exit, NULL, NULL);
  } else {
    look_up_all();
    if (!initialize(&native, &zygote_child, NULL)) {
      emu_log("initialize failed\n");
      return false;
    }
  }
  atomic_store(&current, &hooks);
  emu_log("initialize ok\n");
  return true;
}

static void *init_thread(void *arg) {
  (void)arg;
  install_hooks();
  return NULL;
}

static void on_profiling_signal(int sig, siginfo_t *info, void *ctx) {
  (void)sig; (void)ctx;
  if (info->si_code != SI_QUEUE || info->si_value.sival_int != 0) return;
  atomic_store(&signal_pending, 1);
}

// bionic's MallocInitHeapprofdHook: the table out, a thread to initialize.
static void start_init_thread(void) {
  atomic_store(&current, NULL);
  pthread_t t;
  if (pthread_create(&t, NULL, init_thread, NULL) == 0) {
    pthread_setname_np(t, "heapprofdinit");
    pthread_detach(t);
  }
}

static int selftest(void) {
  const MallocDispatch *d = &hooks;
  static const char *names[N_SLOTS] = {"calloc", "free", "mallinfo", "malloc", "malloc_usable_size",
                                       "memalign", "posix_memalign", "realloc", "malloc_iterate",
                                       "malloc_disable", "malloc_enable", "mallopt",
                                       "aligned_alloc", "malloc_info"};
  long before[N_SLOTS];
  for (int i = 0; i < N_SLOTS; i++) before[i] = atomic_load(&calls[i]);
  void *a = d->malloc(10);
  void *b = d->calloc(2, 10);
  b = d->realloc(b, 100);
  void *c = d->memalign(64, 10);
  void *e = d->aligned_alloc(64, 64);
  void *f = NULL;
  int rc = d->posix_memalign(&f, 64, 10);
  size_t usable = d->malloc_usable_size(a);
  struct bionic_mallinfo mi = d->mallinfo();
  int opt = d->mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  FILE *null = fopen("/dev/null", "w");
  int info = d->malloc_info(0, null);
  fclose(null);
  d->malloc_disable();
  int it = d->malloc_iterate(0, 0, NULL, NULL);
  d->malloc_enable();
  d->free(a); d->free(b); d->free(c); d->free(e); d->free(f);
  if (!a || !b || !c || !e || rc != 0 || !f || usable < 10 || mi.f[0] == 0 || opt != 1 ||
      info != 0 || it != -1 || (uintptr_t)c % 64 || (uintptr_t)e % 64 || (uintptr_t)f % 64) {
    fprintf(stderr, "emulated bionic: selftest: a result differs from glibc's\n");
    return 98;
  }
  for (int i = 0; i < N_SLOTS; i++)
    if (atomic_load(&calls[i]) == before[i]) {
      fprintf(stderr, "emulated bionic: selftest: heapprofd_%s did not reach the native %s\n",
              names[i], names[i]);
      return 98;
    }
  printf("selftest: %d entries forwarded\n", N_SLOTS);
  fflush(stdout);
  return 0;
}

__attribute__((constructor)) static void emulated_libc_init(void) {
  glibc_usable = dlsym(RTLD_NEXT, "malloc_usable_size");
  glibc_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
  glibc_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_profiling_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(36, &sa, NULL);  // __SIGRTMIN + 4 (the kernel's SIGRTMIN is 32)
  const char *enable = getenv("HEAPPROFD_EMU_ENABLE");
  if (getenv("HEAPPROFD_EMU_SELFTEST")) {
    // No daemon needed: initialize (which keeps the native table) and then
    // the library's functions called directly.
    const char *lib = getenv("HEAPPROFD_EMU_CLIENT");
    handle = lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!handle) _exit(96);
    look_up_all();
    initialize(&native, &zygote_child, NULL);
    _exit(selftest());
  }
  if (enable && !strcmp(enable, "1")) install_hooks();
}

// ---- the public malloc family: through the current table ----
static inline const MallocDispatch *table(void) {
  return atomic_load_explicit(&current, memory_order_acquire);
}

void *malloc(size_t n) {
  if (atomic_load_explicit(&signal_pending, memory_order_relaxed) &&
      atomic_exchange(&signal_pending, 0)) {
    start_init_thread();
    return __libc_malloc(n);
  }
  const MallocDispatch *d = table();
  return d ? d->malloc(n) : __libc_malloc(n);
}
void free(void *p) {
  const MallocDispatch *d = table();
  if (d) d->free(p); else __libc_free(p);
}
void *calloc(size_t a, size_t b) {
  const MallocDispatch *d = table();
  return d ? d->calloc(a, b) : __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
  const MallocDispatch *d = table();
  return d ? d->realloc(p, n) : __libc_realloc(p, n);
}
void *memalign(size_t a, size_t n) {
  const MallocDispatch *d = table();
  return d ? d->memalign(a, n) : __libc_memalign(a, n);
}
void *aligned_alloc(size_t a, size_t n) {
  const MallocDispatch *d = table();
  return d ? d->aligned_alloc(a, n) : glibc_aligned_alloc(a, n);
}
int posix_memalign(void **o, size_t a, size_t n) {
  const MallocDispatch *d = table();
  return d ? d->posix_memalign(o, a, n) : glibc_posix_memalign(o, a, n);
}
size_t malloc_usable_size(void *p) {
  const MallocDispatch *d = table();
  return d ? d->malloc_usable_size(p) : glibc_usable(p);
}
// LP64 bionic has no valloc/pvalloc in its table: native, as a 64-bit
// bionic program could not call them.
void *valloc(size_t n) { return __libc_valloc(n); }
void *pvalloc(size_t n) { return __libc_pvalloc(n); }
