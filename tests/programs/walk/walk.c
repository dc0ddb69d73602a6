/* The stack-request API's in-process walk (heapprofd_walk_stack) driven by
 * tests/tests/stack_walk.rs. Built -O2 -fomit-frame-pointer -rdynamic.
 * Modes (argv[1]):
 *   chain          a -> b -> c -> leaf; leaf walks its own stack (NULL
 *                  context) and prints "FRAME type pc" lines, then
 *                  "END" or "FAIL reason" (the test compares them with
 *                  gdb's frames at a breakpoint on heapprofd_walk_stack)
 *   sigprof N      burns CPU in burn_a/b/c under setitimer(ITIMER_PROF),
 *                  and a second thread sends SIGPROF to the burner until N
 *                  walks were made; the handler walks from its ucontext
 *   malloc N       the same, with the main thread looping malloc/free
 *                  (either with a third argument "thread": the burner is a
 *                  thread of its own, REACHED_MAIN counts walks reaching
 *                  its start function burn_thread)
 *   dlchurn N LIB  the same, with the main thread looping dlopen(LIB) and
 *                  dlclose (ALLOCS counts the rounds)
 *   corrupt        walks of made-up contexts: pc 0x40 (no object), a pc in
 *                  the program with a stack of garbage return addresses,
 *                  a stack pointer on no stack
 *   bench N [D]    N walks of a stack D frames deeper than chain's, in a
 *                  loop: the thread's CPU time per walk (docs/PERFORMANCE.md)
 *   jit            jit_leaf walks from under a function generated at run
 *                  time (frame pointer, named in /tmp/perf-PID.map)
 *   deep           recursion 300 deep, then a walk (depth limit)
 *   noclient       the header's no-op without the client
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <heapprofd.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

/* ---- what the callbacks saw (fixed storage: handlers use it) ---- */
struct seen {
  int biased, n, ended, reason;
  uint64_t pcs[HEAPPROFD_WALK_MAX_FRAMES];
  int types[HEAPPROFD_WALK_MAX_FRAMES];
};

static void on_begin(uint64_t t, int biased, void *u) {
  (void)t;
  struct seen *s = u;
  s->biased = biased;
  s->n = 0;
  s->ended = 0;
  s->reason = 0;
}
static void on_frame(int type, uint64_t pc, void *u) {
  struct seen *s = u;
  if (s->n < HEAPPROFD_WALK_MAX_FRAMES) {
    s->types[s->n] = type;
    s->pcs[s->n++] = pc;
  }
}
static void on_end(uint64_t t, void *u) {
  (void)t;
  ((struct seen *)u)->ended = 1;
}
static void on_failure(uint64_t t, int reason, void *u) {
  (void)t;
  ((struct seen *)u)->reason = reason;
}
static const struct heapprofd_stack_callbacks cbs = {on_begin, on_frame, on_end, on_failure};

static void print_seen(const struct seen *s, int rc) {
  printf("RC %d BIASED %d\n", rc, s->biased);
  for (int i = 0; i < s->n; i++) printf("FRAME %d %" PRIx64 "\n", s->types[i], s->pcs[i]);
  if (s->ended) printf("END\n");
  else printf("FAIL %d\n", s->reason);
}

/* ---- chain ---- */
static struct seen chain_seen;
volatile int sink;
NOINLINE void leaf(void) {
  int rc = heapprofd_walk_stack(NULL, &cbs, &chain_seen);
  print_seen(&chain_seen, rc);
  sink++;
}
static uint64_t bench_n;
NOINLINE void bench_leaf(void) {
  static struct seen s;
  struct timespec t0, t1;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  uint64_t ok = 0;
  for (uint64_t i = 0; i < bench_n; i++) ok += heapprofd_walk_stack(NULL, &cbs, &s) == 0;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
  double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
  printf("BENCH %" PRIu64 " walks, %" PRIu64 " ended, %d frames each, %.0f ns CPU per walk\n", bench_n,
         ok, s.n, ns / (double)bench_n);
}
static int bench_depth;
NOINLINE int bench_recurse(int n) {
  if (n <= 0) bench_leaf();
  else sink += bench_recurse(n - 1);
  return n;
}
NOINLINE void c_fn(int x) { if (x) { if (bench_n) bench_recurse(bench_depth); else leaf(); } sink += x; }
NOINLINE void b_fn(int x) { c_fn(x + 1); sink += x; }
NOINLINE void a_fn(int x) { b_fn(x * 2); sink += x; }

/* ---- signal modes ---- */
static struct seen sig_seen;
static volatile uint64_t walks, ended, mismatched, reasons[16];
#define KEEP 4096
static uint64_t inner[KEEP];
static uint64_t reached_main;
/* The first failed walk's first frames, named after the run. */
static int fail_n;
static uint64_t fail_pcs[8];
static uint64_t main_lo, main_hi;
static volatile int stop;

static void on_sigprof(int sig, siginfo_t *si, void *ucv) {
  (void)sig;
  (void)si;
  ucontext_t *uc = ucv;
  int rc = heapprofd_walk_stack(uc, &cbs, &sig_seen);
  uint64_t w = walks;
  if (rc == HEAPPROFD_WALK_ENDED) ended++;
  else if (sig_seen.reason > 0 && sig_seen.reason < 16) reasons[sig_seen.reason]++;
  if (rc != HEAPPROFD_WALK_ENDED && !fail_n) {
    fail_n = sig_seen.n < 8 ? sig_seen.n : 8;
    for (int i = 0; i < fail_n; i++) fail_pcs[i] = sig_seen.pcs[i];
  }
  if (sig_seen.n > 0) {
#if defined(__x86_64__)
    uint64_t pc = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
#else
    uint64_t pc = (uint64_t)uc->uc_mcontext.pc;
#endif
    if (sig_seen.pcs[0] != pc || sig_seen.biased) mismatched++;
    inner[w % KEEP] = sig_seen.pcs[0];
    for (int i = 0; i < sig_seen.n; i++)
      if (sig_seen.pcs[i] > main_lo && sig_seen.pcs[i] <= main_hi) {
        reached_main++;
        break;
      }
  } else {
    mismatched++;
  }
  walks = w + 1;
}

NOINLINE uint64_t burn_c(uint64_t x) {
  for (int i = 0; i < 1000; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}
NOINLINE uint64_t burn_b(uint64_t x) {
  for (int i = 0; i < 3; i++) x ^= burn_c(x + i);
  return x;
}
NOINLINE uint64_t burn_a(uint64_t x) {
  for (int i = 0; i < 3; i++) x += burn_b(x >> 1);
  return x;
}

static pthread_t burner;
static int burner_ready;
static uint64_t target;
/* Sends SIGPROF to the burner, one at a time: the next once the handler
 * has counted the walk (or after a while: a signal merged with the
 * timer's). SIGPROF is blocked here, so every SIGPROF, the timer's
 * included, is handled on the burner and handlers never overlap. */
static void *flood(void *arg) {
  (void)arg;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPROF);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  while (walks < target) {
    uint64_t w = walks;
    pthread_kill(burner, SIGPROF);
    for (int spin = 0; walks == w && spin < 100000; spin++) {
      if (spin > 100) sched_yield();
    }
  }
  stop = 1;
  return NULL;
}

#include <link.h>
int main(int argc, char **argv);

static const char *dl_path;

static int use_malloc_;
static uint64_t x_, allocs_;

/* The loop the signals interrupt (on the main thread, or on its own). */
static void burn_loop(void) {
  uint64_t x = 1, allocs = 0;
  while (!stop) {
    if (dl_path) {
      /* Each dlopen of a path and each dlclose rebuilds the client's
       * tables: the handler's walks interrupt those updates. */
      void *h = dlopen(dl_path, RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", dl_path, dlerror());
        exit(1);
      }
      dlclose(h);
      allocs++;
    } else if (use_malloc_) {
      void *p[8];
      for (int i = 0; i < 8; i++) p[i] = malloc(16 + (size_t)((x + i * 977) % 4000));
      for (int i = 0; i < 8; i++) free(p[i]);
      x = x * 31 + 7;
      allocs += 8;
    } else {
      x = burn_a(x);
    }
  }
  x_ = x;
  allocs_ = allocs;
}

/* The root of the burner thread's walks in "thread" runs. */
NOINLINE void *burn_thread(void *arg) {
  (void)arg;
  burner = pthread_self();
  __atomic_store_n(&burner_ready, 1, __ATOMIC_RELEASE);
  burn_loop();
  return NULL;
}

static int signal_mode(int use_malloc, uint64_t n, int on_thread) {
  target = n;
  use_malloc_ = use_malloc;
  /* The root function's extent (exported: -rdynamic), for "the walk
   * reached main" (or the burner thread's start function). */
  Dl_info mi;
  const ElfW(Sym) *msym = NULL;
  void *root = on_thread ? (void *)(uintptr_t)&burn_thread : (void *)(uintptr_t)&main;
  if (dladdr1(root, &mi, (void **)&msym, RTLD_DL_SYMENT) && msym) {
    main_lo = (uint64_t)(uintptr_t)mi.dli_saddr;
    main_hi = main_lo + msym->st_size;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigprof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPROF, &sa, NULL);
  pthread_t bt;
  if (on_thread) {
    pthread_create(&bt, NULL, burn_thread, NULL);
    while (!__atomic_load_n(&burner_ready, __ATOMIC_ACQUIRE)) sched_yield();
    /* Only the burner takes SIGPROF (the timer's is process-wide). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPROF);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
  } else {
    burner = pthread_self();
  }
  struct itimerval it = {{0, 1000}, {0, 1000}};
  setitimer(ITIMER_PROF, &it, NULL);
  pthread_t t;
  /* The flood thread starts with SIGPROF blocked (it blocks it itself too
     late: a process-wide timer signal taken before, by a second handler
     writing sig_seen at once, counted as a mismatch). */
  sigset_t prof, was;
  sigemptyset(&prof);
  sigaddset(&prof, SIGPROF);
  pthread_sigmask(SIG_BLOCK, &prof, &was);
  pthread_create(&t, NULL, flood, NULL);
  pthread_sigmask(SIG_SETMASK, &was, NULL);
  if (on_thread) pthread_join(bt, NULL);
  else burn_loop();
  uint64_t x = x_, allocs = allocs_;
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &off, NULL);
  pthread_join(t, NULL);
  signal(SIGPROF, SIG_IGN);
  printf("WALKS %" PRIu64 " ENDED %" PRIu64 " MISMATCHED %" PRIu64 " REACHED_MAIN %" PRIu64
         " ALLOCS %" PRIu64 " X %" PRIu64 "\n",
         walks, ended, mismatched, reached_main, allocs, x & 1);
  for (int r = 1; r < 16; r++)
    if (reasons[r]) printf("REASON %d %" PRIu64 "\n", r, reasons[r]);
  for (int i = 0; i < fail_n; i++) {
    Dl_info info;
    int ok = dladdr((void *)(uintptr_t)fail_pcs[i], &info);
    printf("FAILED_FRAME %" PRIx64 " %s %s\n", fail_pcs[i], ok && info.dli_sname ? info.dli_sname : "?",
           ok && info.dli_fname ? info.dli_fname : "?");
  }
  /* Where the kept walks started, by function (or object). */
  uint64_t kept = walks < KEEP ? walks : KEEP;
  for (uint64_t i = 0; i < kept; i++) {
    Dl_info info;
    const char *name = "?";
    if (dladdr((void *)(uintptr_t)inner[i], &info)) {
      name = info.dli_sname ? info.dli_sname : "";
      printf("INNER %s %s\n", name, info.dli_fname ? info.dli_fname : "?");
    } else {
      printf("INNER ? ?\n");
    }
  }
  return 0;
}

/* ---- corrupt / deep / noclient ---- */
static int corrupt_mode(void) {
  struct seen s;
  ucontext_t uc;
  getcontext(&uc);
  /* 1: a pc in no loaded object. */
#if defined(__x86_64__)
  uc.uc_mcontext.gregs[REG_RIP] = 0x40;
#else
  uc.uc_mcontext.pc = 0x40;
#endif
  int rc = heapprofd_walk_stack(&uc, &cbs, &s);
  printf("CASE nopc\n");
  print_seen(&s, rc);
  /* 2: the entry of burn_c (return address at sp) over a stack of
   * garbage: the "return address" read is 0x4141..., in no object. */
  uint64_t garbage[64];
  for (int i = 0; i < 64; i++) garbage[i] = 0x4141414141414141ull;
  getcontext(&uc);
#if defined(__x86_64__)
  uc.uc_mcontext.gregs[REG_RIP] = (greg_t)(uintptr_t)&burn_c;
  uc.uc_mcontext.gregs[REG_RSP] = (greg_t)(uintptr_t)&garbage[8];
  uc.uc_mcontext.gregs[REG_RBP] = 0x4242424242424242;
#else
  uc.uc_mcontext.pc = (uint64_t)(uintptr_t)&burn_c;
  uc.uc_mcontext.sp = (uint64_t)(uintptr_t)&garbage[8];
  uc.uc_mcontext.regs[30] = 0x4141414141414141ull;
  uc.uc_mcontext.regs[29] = 0x4242424242424242ull;
#endif
  rc = heapprofd_walk_stack(&uc, &cbs, &s);
  printf("CASE garbage\n");
  print_seen(&s, rc);
  sink += (int)garbage[3];
  /* 3: a stack pointer on no stack. */
  getcontext(&uc);
#if defined(__x86_64__)
  uc.uc_mcontext.gregs[REG_RSP] = 0x1000;
#else
  uc.uc_mcontext.sp = 0x1000;
#endif
  rc = heapprofd_walk_stack(&uc, &cbs, &s);
  printf("CASE nostack\n");
  print_seen(&s, rc);
  return 0;
}

static struct seen deep_seen;
NOINLINE int recurse(int n) {
  if (n == 0) {
    int rc = heapprofd_walk_stack(NULL, &cbs, &deep_seen);
    print_seen(&deep_seen, rc);
    return rc;
  }
  int r = recurse(n - 1);
  sink += r;
  return r + 1;
}

/* ---- jit: a frame in generated code that a perf map names ---- */
static struct seen jit_seen;
NOINLINE void jit_leaf(void) {
  int rc = heapprofd_walk_stack(NULL, &cbs, &jit_seen);
  print_seen(&jit_seen, rc);
  sink++;
}
NOINLINE void run_jit(void (*code)(void (*)(void))) {
  code(jit_leaf);
  sink++;
}
static int jit_mode(void) {
  /* void code(void (*f)(void)) { f(); } with a frame pointer, as JITs do. */
#if defined(__x86_64__)
  static const unsigned char code[] = {0x55, 0x48, 0x89, 0xe5, 0xff, 0xd7, 0x5d, 0xc3};
#else
  static const uint32_t code[] = {0xa9bf7bfd, 0x910003fd, 0xd63f0000, 0xa8c17bfd, 0xd65f03c0};
#endif
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char *p = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 1;
  memcpy(p, code, sizeof code);
  __builtin___clear_cache((char *)p, (char *)p + sizeof code);
  if (mprotect(p, page, PROT_READ | PROT_EXEC)) return 1;
  char path[64];
  snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
  FILE *f = fopen(path, "w");
  if (!f) return 1;
  fprintf(f, "%lx %zx jit_trampoline\n", (unsigned long)(uintptr_t)p, sizeof code);
  fclose(f);
  int prep = heapprofd_walk_prepare(); /* reads the perf map */
  printf("JIT %lx %zx PREPARE %d\n", (unsigned long)(uintptr_t)p, sizeof code, prep);
  run_jit((void (*)(void (*)(void)))(void *)p);
  unlink(path);
  return 0;
}

static int noclient_mode(void) {
  struct seen s;
  s.n = -1;
  int prep = heapprofd_walk_prepare();
  int rc = heapprofd_walk_stack(NULL, &cbs, &s);
  printf("PREPARE %d WALK %d CALLED %d\n", prep, rc, s.n != -1);
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "chain";
  if (!strcmp(mode, "noclient")) return noclient_mode();
  int prep = heapprofd_walk_prepare();
  printf("PREPARE %d\n", prep);
  if (prep != 0) return 1;
  if (!strcmp(mode, "chain")) {
    a_fn(argc);
  } else if (!strcmp(mode, "dlchurn")) {
    dl_path = argc > 3 ? argv[3] : NULL;
    if (!dl_path) return 2;
    signal_mode(0, strtoull(argv[2], NULL, 10), 0);
  } else if (!strcmp(mode, "sigprof") || !strcmp(mode, "malloc")) {
    uint64_t n = argc > 2 ? strtoull(argv[2], NULL, 10) : 100000;
    int on_thread = argc > 3 && !strcmp(argv[3], "thread");
    signal_mode(!strcmp(mode, "malloc"), n, on_thread);
  } else if (!strcmp(mode, "corrupt")) {
    corrupt_mode();
  } else if (!strcmp(mode, "bench")) {
    bench_n = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000000;
    bench_depth = argc > 3 ? atoi(argv[3]) : 0;
    a_fn(argc);
  } else if (!strcmp(mode, "jit")) {
    jit_mode();
  } else if (!strcmp(mode, "deep")) {
    recurse(300);
  }
  fflush(stdout);
  return 0;
}

