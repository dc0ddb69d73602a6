/* One of the libraries tests/programs/churn/churn.c loads and unloads.
 * Built N times with -DPLUGIN=k (k = 0..N-1): each copy has its own
 * function names and constants, so its own build id. churn_work allocates
 * from functions of this library at a depth that varies with `round`, so
 * the daemon sees new modules and new stacks all the time. */
#include <stdlib.h>
#include <string.h>

#ifndef PLUGIN
#error "build with -DPLUGIN=<number>"
#endif

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define NAME(f) CAT(f, CAT(_, PLUGIN))

/* Each copy has its own size (PLUGIN pages of read-only data), so the
 * copies loaded together land at addresses that keep moving. */
__attribute__((used)) static const char NAME(plugin_pad)[1 + PLUGIN * 4096] = {PLUGIN};

/* Allocations made by one churn_work call. */
#define BLOCKS 24

__attribute__((noinline)) static void *NAME(plugin_leaf)(size_t size) {
    char *p = malloc(size);
    if (p) memset(p, PLUGIN & 0xff, size < 64 ? size : 64);
    return p;
}

__attribute__((noinline)) static void NAME(plugin_descend)(int depth, void **out, size_t size) {
    if (depth > 0) {
        NAME(plugin_descend)(depth - 1, out, size + 16);
        __asm__ volatile("" ::: "memory");
        return;
    }
    for (int i = 0; i < BLOCKS; i++) out[i] = NAME(plugin_leaf)(size + (size_t)i * 8);
}

/* BLOCKS allocations of about 1 KiB (distinct stacks for depth 0..7),
 * all freed; with `keep`, one more block of 64 KiB (always sampled) that
 * the caller keeps for good: its frames must keep their names after this
 * library is unloaded. */
__attribute__((visibility("default"))) void *churn_work(unsigned round, int keep) {
    void *blocks[BLOCKS];
    NAME(plugin_descend)((int)(round % 8), blocks, 1024 + PLUGIN * 8);
    for (int i = 0; i < BLOCKS; i++) free(blocks[i]);
    return keep ? NAME(plugin_leaf)(65536) : NULL;
}
