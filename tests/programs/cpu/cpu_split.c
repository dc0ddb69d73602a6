/* CPU-time ground truth: two threads that burn CPU in known shares.
 *
 *   cpu_split TOTAL_MS HOT_PERCENT
 *
 * Thread "hot" burns HOT_PERCENT of TOTAL_MS of its own CPU time in
 * hot_work(), thread "cold" the rest in cold_work(), both measured with
 * their own CLOCK_THREAD_CPUTIME_ID (so the split holds whatever the
 * scheduler does); a third thread, "sleeper", only sleeps (it must get no
 * samples). At the end it prints the process's CPU time from getrusage in
 * nanoseconds: `rusage_ns N`. Built -O1 -fno-omit-frame-pointer -fno-inline. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) static uint64_t spin(uint64_t n) {
  uint64_t x = n;
  for (uint64_t i = 0; i < n; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}

__attribute__((noinline)) void hot_work(uint64_t ns) {
  uint64_t end = thread_cpu_ns() + ns;
  while (thread_cpu_ns() < end) sink += spin(20000);
}

__attribute__((noinline)) void cold_work(uint64_t ns) {
  uint64_t end = thread_cpu_ns() + ns;
  while (thread_cpu_ns() < end) sink += spin(20000);
}

static uint64_t total_ns, hot_pct;

static void *hot(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "hot");
  hot_work(total_ns * hot_pct / 100);
  return NULL;
}

static void *cold(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "cold");
  cold_work(total_ns * (100 - hot_pct) / 100);
  return NULL;
}

static volatile int done;

static void *sleeper(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "sleeper");
  while (!done) usleep(20000);
  return NULL;
}

int main(int argc, char **argv) {
  total_ns = (argc > 1 ? strtoull(argv[1], NULL, 10) : 2000) * 1000000ull;
  hot_pct = argc > 2 ? strtoull(argv[2], NULL, 10) : 90;
  /* Let the profiler's watcher arm the timers of the threads to come. */
  usleep(200000);
  pthread_t a, b, c;
  pthread_create(&c, NULL, sleeper, NULL);
  pthread_create(&a, NULL, hot, NULL);
  pthread_create(&b, NULL, cold, NULL);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  done = 1;
  pthread_join(c, NULL);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  uint64_t ns = (uint64_t)ru.ru_utime.tv_sec * 1000000000ull + ru.ru_utime.tv_usec * 1000ull +
                (uint64_t)ru.ru_stime.tv_sec * 1000000000ull + ru.ru_stime.tv_usec * 1000ull;
  printf("rusage_ns %llu\n", (unsigned long long)ns);
  return 0;
}
