/* A server serving two endpoints from a thread pool, labelling what each
 * request allocates with a user context (heapprofd.h).
 *
 * The acceptor (main thread) makes one context per endpoint
 * ("endpoint=/a", "endpoint=/b") and, per request, a request context
 * extending it ("request=N", created while the endpoint's is installed),
 * snapshots it with heapprofd_context_current() into the request and hands
 * the request to a pool of WORKERS threads through a queue. A worker
 * installs the snapshot (heapprofd_context_activate), handles the request
 * (/a allocates three times what /b does: 3 * UNITS blocks against UNITS,
 * sizes 16 to 1008 bytes by request and block), frees it all, restores
 * its previous context and releases the request's. Requests alternate
 * /a, /b. The queue nodes are allocated by the acceptor outside any
 * context.
 *
 * At most MAX_QUEUED requests wait in the queue (the acceptor waits for
 * room, as a server's bounded queue makes it), so a few hundred contexts
 * are alive at once. MAX_QUEUED 0 holds the workers until every request is
 * queued: all REQUESTS request contexts are alive at once, and beyond the
 * client's 4095 (4093 with the two endpoints') they are the overflow
 * context.
 *
 * Usage: endpoints REQUESTS [MAX_QUEUED (default 64)]. Prints "endpoint /a bytes=N allocs=M", the
 * same for /b, "none bytes=N allocs=M" (the queue nodes) and
 * "contexts ok" if every snapshot was the context it was made from. Keep
 * in sync with tests/tests/contexts.rs. */
#include <heapprofd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORKERS 4
#define UNITS 8

struct request {
  struct request *next;
  int endpoint; /* 0 = /a, 1 = /b */
  unsigned long n;
  uint64_t ctx;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready = PTHREAD_COND_INITIALIZER;
static pthread_cond_t room = PTHREAD_COND_INITIALIZER;
static struct request *head, *tail;
static unsigned long queued, max_queued;
static int done;
static int bad;

static size_t block_size(unsigned long n, int i) { return 16 + ((n * 7 + (unsigned long)i * 13) % 63) * 16; }

/* What a request allocates: /a 3 * UNITS blocks, /b UNITS. */
__attribute__((noinline)) static void handle(struct request *r) {
  void *blocks[3 * UNITS];
  int count = r->endpoint == 0 ? 3 * UNITS : UNITS;
  for (int i = 0; i < count; i++) {
    blocks[i] = malloc(block_size(r->n, i));
    memset(blocks[i], 1, 8);
  }
  for (int i = 0; i < count; i++) free(blocks[i]);
}

static void *worker(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&lock);
    while ((!head || (max_queued == 0 && !done)) && !(done && !head))
      pthread_cond_wait(&ready, &lock);
    struct request *r = head;
    if (r) {
      head = r->next;
      if (!head) tail = NULL;
      queued--;
      pthread_cond_signal(&room);
    }
    pthread_mutex_unlock(&lock);
    if (!r) return NULL;
    uint64_t token = heapprofd_context_activate(r->ctx);
    if (heapprofd_context_current() != r->ctx) __atomic_store_n(&bad, 1, __ATOMIC_RELAXED);
    handle(r);
    heapprofd_context_deactivate(token);
    heapprofd_context_release(r->ctx);
    free(r);
  }
}

int main(int argc, char **argv) {
  unsigned long requests = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000;
  max_queued = argc > 2 ? strtoul(argv[2], NULL, 10) : 64;
  const char *key[] = {"endpoint"};
  const char *a[] = {"/a"}, *b[] = {"/b"};
  uint64_t endpoints[2] = {heapprofd_context_create(0, key, a, 1),
                           heapprofd_context_create(0, key, b, 1)};
  unsigned long long bytes[2] = {0, 0}, allocs[2] = {0, 0};
  pthread_t t[WORKERS];
  for (int i = 0; i < WORKERS; i++) pthread_create(&t[i], NULL, worker, NULL);
  for (unsigned long n = 0; n < requests; n++) {
    struct request *r = malloc(sizeof *r); /* outside any context */
    r->next = NULL;
    r->endpoint = (int)(n % 2);
    r->n = n;
    uint64_t outer = heapprofd_context_activate(endpoints[r->endpoint]);
    char id[24];
    snprintf(id, sizeof id, "%lu", n);
    const char *rk[] = {"request"}, *rv[] = {id};
    uint64_t req = heapprofd_context_create(0, rk, rv, 1); /* extends the endpoint's */
    uint64_t inner = heapprofd_context_activate(req);
    r->ctx = heapprofd_context_current(); /* the snapshot handed to the worker */
    if (r->ctx != req) bad = 1;
    heapprofd_context_deactivate(inner);
    heapprofd_context_deactivate(outer);
    if (heapprofd_context_current() != 0) bad = 1;
    int count = r->endpoint == 0 ? 3 * UNITS : UNITS;
    for (int i = 0; i < count; i++) {
      bytes[r->endpoint] += block_size(n, i);
      allocs[r->endpoint]++;
    }
    pthread_mutex_lock(&lock);
    while (max_queued && queued >= max_queued) pthread_cond_wait(&room, &lock);
    if (tail) tail->next = r; else head = r;
    tail = r;
    queued++;
    pthread_cond_signal(&ready);
    pthread_mutex_unlock(&lock);
  }
  pthread_mutex_lock(&lock);
  done = 1;
  pthread_cond_broadcast(&ready);
  pthread_mutex_unlock(&lock);
  for (int i = 0; i < WORKERS; i++) pthread_join(t[i], NULL);
  printf("endpoint /a bytes=%llu allocs=%llu\n", bytes[0], allocs[0]);
  printf("endpoint /b bytes=%llu allocs=%llu\n", bytes[1], allocs[1]);
  printf("none bytes=%llu allocs=%lu\n", (unsigned long long)(requests * sizeof(struct request)), requests);
  printf(bad ? "contexts wrong\n" : "contexts ok\n");
  return bad;
}
