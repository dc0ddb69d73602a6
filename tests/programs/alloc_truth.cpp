// Ground-truth allocation program for the end-to-end tests of `record`.
//
// Every allocating function is noinline and allocates a fixed, known number
// of bytes in a fixed number of calls, so the profile at interval 1 can be
// compared exactly with the table in tests/tests/record_truth.rs (keep the two in
// sync). Some memory is freed, some kept until exit.
//
// Usage: alloc_truth [REPS] (default 1): main calls every allocating function
// REPS times and each thread calls thread_alloc REPS times, so every
// function's totals are REPS times the table's (the sampled-interval test uses
// a large REPS to have enough bytes for a tight Poisson bound).
//
// Build: g++ -O2 -g (frame pointers omitted: the unwinder must cope).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <pthread.h>
#include <vector>

#define NOINLINE __attribute__((noinline))

static std::vector<void *> g_keep;
static volatile unsigned long g_sink;

static void keep(void *p) {
    g_sink += (unsigned long)p;
    g_keep.push_back(p);  // the vector's own growth allocates too: reserved up front
}

// 100 x 1000 bytes, kept.
extern "C" NOINLINE void leak_malloc() {
    for (int i = 0; i < 100; i++) keep(malloc(1000));
}

// 200 x 512 bytes, all freed.
extern "C" NOINLINE void temp_malloc() {
    for (int i = 0; i < 200; i++) {
        void *p = malloc(512);
        g_sink += (unsigned long)p;
        free(p);
    }
}

// 30 x calloc(50, 40) = 2000 bytes each, kept.
extern "C" NOINLINE void calloc_site() {
    for (int i = 0; i < 30; i++) keep(calloc(50, 40));
}

// 10 chains: malloc(16) then realloc to 32, 64, ..., 4096, then free.
// Each realloc frees the old block and allocates the new size:
// allocations 16+32+...+4096 = 8176 bytes per chain (9 allocations), all freed.
extern "C" NOINLINE void realloc_chain() {
    for (int c = 0; c < 10; c++) {
        void *p = malloc(16);
        for (size_t n = 32; n <= 4096; n *= 2) {
            p = realloc(p, n);
            memset(p, 1, n);
        }
        free(p);
    }
}

// 10 x posix_memalign(64, 256): 5 freed, 5 kept.
extern "C" NOINLINE void memalign_site() {
    for (int i = 0; i < 10; i++) {
        void *p = nullptr;
        if (posix_memalign(&p, 64, 256) != 0) abort();
        if (i % 2 == 0) free(p); else keep(p);
    }
}

// 20 x new char[300]: 10 deleted, 10 kept.
extern "C" NOINLINE void cpp_new() {
    for (int i = 0; i < 20; i++) {
        char *p = new char[300];
        p[0] = 1;
        if (i % 2 == 0) delete[] p; else keep(p);
    }
}

// Recursion 150 deep, then 5 x 77 bytes at the bottom, kept. The stack of
// each allocation holds 151 deep_recurse frames (n = 150 .. 0): the volatile
// local read after the call keeps gcc from turning the recursion into a
// loop (which it does at -O2 with `return deep_recurse(n - 1) + 1`).
extern "C" NOINLINE void deep_leaf() {
    for (int i = 0; i < 5; i++) keep(malloc(77));
}
extern "C" NOINLINE int deep_recurse(int n) {
    volatile int depth = n;
    if (n == 0) { deep_leaf(); return 0; }
    int r = deep_recurse(n - 1);
    return r + depth;
}

// 4 threads x 64 x 128 bytes, kept (each thread keeps its own list).
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
extern "C" NOINLINE void thread_alloc() {
    void *mine[64];
    for (int i = 0; i < 64; i++) mine[i] = malloc(128);
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < 64; i++) keep(mine[i]);
    pthread_mutex_unlock(&g_lock);
}
static int g_reps = 1;
static void *thread_main(void *) {
    for (int r = 0; r < g_reps; r++) thread_alloc();
    return nullptr;
}

int main(int argc, char **argv) {
    if (argc > 1) g_reps = atoi(argv[1]);
    if (g_reps < 1) return 2;
    // One allocation of 4096 * 8 * REPS bytes (from main, via operator new);
    // 406 blocks per repetition are kept, so the vector never grows.
    g_keep.reserve(4096 * (size_t)g_reps);
    for (int r = 0; r < g_reps; r++) {
        leak_malloc();
        temp_malloc();
        calloc_site();
        realloc_chain();
        memalign_site();
        cpp_new();
        deep_recurse(150);
    }
    pthread_t t[4];
    for (auto &th : t) pthread_create(&th, nullptr, thread_main, nullptr);
    for (auto &th : t) pthread_join(th, nullptr);
    printf("alloc_truth done: kept %zu blocks\n", g_keep.size());
    return 0;
}
