/* JDK's JEP 509 example, native: a local server (a thread reading requests
 * from a socketpair) answers fast requests with 10 ms of CPU-heavy work
 * (handle_fast) and the slow request with 100 ms of mostly waiting
 * (handle_slow: a little work, then a sleep). One client thread makes ten
 * fast requests, another one slow request: the same wall-clock time for
 * each kind (100 ms), but nearly all the CPU time in handle_fast. A CPU
 * profile must say so; a wall-clock profile would split the two evenly. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int fds[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile uint64_t sink;

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) static void burn(uint64_t ns) {
  uint64_t end = thread_cpu_ns() + ns;
  while (thread_cpu_ns() < end)
    for (int i = 0; i < 10000; i++) sink = sink * 6364136223846793005ull + 1;
}

/* (Not tail calls: the handlers stay in the stacks.) */
__attribute__((noinline)) void handle_fast(void) {
  burn(10000000);
  sink++;
}

__attribute__((noinline)) void handle_slow(void) {
  burn(200000);
  usleep(100000);
  sink++;
}

static void *server(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "server");
  char c;
  while (read(fds[1], &c, 1) == 1 && c != 'q') {
    if (c == 'f') handle_fast();
    else handle_slow();
    if (write(fds[1], &c, 1) != 1) break;
  }
  return NULL;
}

/* One request: send its kind, wait for the answer (no CPU meanwhile). */
static void request(char kind) {
  pthread_mutex_lock(&lock);
  char c = kind;
  if (write(fds[0], &c, 1) == 1 && read(fds[0], &c, 1) == 1) {}
  pthread_mutex_unlock(&lock);
}

__attribute__((noinline)) void fast_requests(void) {
  for (int i = 0; i < 10; i++) request('f');
}

__attribute__((noinline)) void slow_request(void) { request('s'); }

static void *fast_client(void *arg) {
  (void)arg;
  fast_requests();
  return NULL;
}

static void *slow_client(void *arg) {
  (void)arg;
  slow_request();
  return NULL;
}

int main(void) {
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 1;
  pthread_t s, a, b;
  pthread_create(&s, NULL, server, NULL);
  usleep(200000); /* the profiler arms the server thread's timer */
  pthread_create(&a, NULL, fast_client, NULL);
  pthread_create(&b, NULL, slow_client, NULL);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  char q = 'q';
  if (write(fds[0], &q, 1) != 1) return 1;
  pthread_join(s, NULL);
  printf("jep509 done\n");
  return 0;
}
