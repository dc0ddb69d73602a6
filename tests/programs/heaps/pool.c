/* A pool allocator reporting into the custom heap "pool" (heapprofd.h):
 * fixed-size slots carved from 64 KiB blocks that come from malloc.
 *
 *   pool NOBJ   allocate NOBJ slots in pool_fill, free every other one in
 *               pool_drain, allocate NOBJ/5 more (reusing freed slots) in
 *               pool_refill; keep the rest.
 *
 * Prints (stdout, with write(2): no stdio buffer is allocated) one line
 *   heap=ID enabled=N interval=I blocks=B
 * and, from the disabled callback, "pool disabled". With `--wait-enabled`
 * it first prints "ready" and waits (up to 100 s, allocating now and then
 * so that a pending activation signal is acted on) until the heap is
 * enabled: the profile starts after the heap was registered; after its
 * line it waits (up to 100 s) until the heap is disabled, prints "bye" and
 * exits. Keep SLOT and
 * BLOCK in sync with tests/tests/custom_heaps.rs. */
#include <heapprofd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SLOT 96
#define BLOCK 65536

struct slot { struct slot *next; };

static struct slot *free_list;
static uint32_t heap_id;
static unsigned blocks;
static volatile int enabled_count;
static volatile uint64_t enabled_interval;
static volatile int disabled_count;

static void refill(void) {
  char *b = malloc(BLOCK);
  if (!b) abort();
  blocks++;
  for (size_t off = 0; off + SLOT <= BLOCK; off += SLOT) {
    struct slot *s = (struct slot *)(b + off);
    s->next = free_list;
    free_list = s;
  }
}

static void *pool_alloc(void) {
  if (!free_list) refill();
  struct slot *s = free_list;
  free_list = s->next;
  AHeapProfile_reportAllocation(heap_id, (uint64_t)(uintptr_t)s, SLOT);
  return s;
}

static void pool_free(void *p) {
  AHeapProfile_reportFree(heap_id, (uint64_t)(uintptr_t)p);
  struct slot *s = p;
  s->next = free_list;
  free_list = s;
}

static void on_enabled(void *data, const AHeapProfileEnableCallbackInfo *info) {
  (void)data;
  enabled_interval = AHeapProfileEnableCallbackInfo_getSamplingInterval(info);
  __atomic_fetch_add(&enabled_count, 1, __ATOMIC_SEQ_CST);
}

static void on_disabled(void *data, const AHeapProfileDisableCallbackInfo *info) {
  (void)data;
  (void)info;
  static const char msg[] = "pool disabled\n";
  write(1, msg, sizeof msg - 1);
  __atomic_fetch_add(&disabled_count, 1, __ATOMIC_SEQ_CST);
}

__attribute__((noinline)) static void pool_fill(void **objs, int n) {
  for (int i = 0; i < n; i++) objs[i] = pool_alloc();
}

__attribute__((noinline)) static void pool_drain(void **objs, int n) {
  for (int i = 0; i < n; i += 2) {
    pool_free(objs[i]);
    objs[i] = NULL;
  }
}

__attribute__((noinline)) static void pool_refill(void **objs, int n) {
  for (int i = 0, done = 0; i < n && done < n / 5; i += 2, done++) objs[i] = pool_alloc();
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 10000;
  int wait = argc > 2 && strcmp(argv[2], "--wait-enabled") == 0;
  AHeapInfo *info = AHeapInfo_create("pool");
  AHeapInfo_setEnabledCallback(info, on_enabled, NULL);
  AHeapInfo_setDisabledCallback(info, on_disabled, NULL);
  heap_id = AHeapProfile_registerHeap(info);
  if (wait) {
    static const char ready[] = "ready\n";
    write(1, ready, sizeof ready - 1);
    for (int i = 0; i < 100000 && !__atomic_load_n(&enabled_count, __ATOMIC_SEQ_CST); i++) {
      free(malloc(16));
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  }
  /* The object table comes from mmap-free static storage: only the pool's
   * blocks are malloc'ed while profiled. */
  static void *objs[1 << 20];
  if (n > (int)(sizeof objs / sizeof objs[0])) n = sizeof objs / sizeof objs[0];
  pool_fill(objs, n);
  pool_drain(objs, n);
  pool_refill(objs, n);
  char line[128];
  int len = snprintf(line, sizeof line, "heap=%u enabled=%d interval=%llu blocks=%u\n", heap_id,
                     enabled_count, (unsigned long long)enabled_interval, blocks);
  write(1, line, len);
  if (wait) {
    /* Until the profile ends (the disabled callback), then exit. */
    for (int i = 0; i < 100000 && !__atomic_load_n(&disabled_count, __ATOMIC_SEQ_CST); i++) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    static const char bye[] = "bye\n";
    write(1, bye, sizeof bye - 1);
  }
  return 0;
}
