// C++ allocation workload for the allocator and corpus tests: every
// operator new/delete variant (plain, array, sized, aligned, nothrow), the
// C malloc family, standard containers, a failing `new` that throws
// std::bad_alloc (caught), on the main thread and two more.
//
// Every allocating function is noinline and makes a fixed number of
// allocations of fixed sizes per repetition; tests/tests/corpus.rs keeps the
// same table (keep them in sync). Nothing else allocates after start-up
// except glibc's stdout buffer for the final line.
//
// Usage: cxx_alloc [REPS [bad_alloc|served]] (default 100; `bad_alloc`: also
// the failing new, whose exception passes through the hook; mimalloc aborts
// there instead of throwing; `served`: then prints how much of 4 MiB kept
// through malloc and of 4 MiB kept through new glibc's heap holds, to tell
// which allocator served them, see `served`). Build: g++ -O2 -g, optionally
// linked with -ljemalloc, -ltcmalloc_minimal or -lmimalloc, or run with one
// of them in LD_PRELOAD.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <malloc.h>
#include <new>
#include <pthread.h>
#include <string>
#include <vector>

#define NOINLINE __attribute__((noinline))

static volatile unsigned long g_sink;

struct Obj {
    char bytes[40];
};
struct alignas(64) Aligned {
    char bytes[128];
};

// 1 x new Obj (40 B) + delete (sized delete, -fsized-deallocation).
extern "C" NOINLINE void cxx_plain() {
    Obj *o = new Obj;
    g_sink += (unsigned long)o;
    delete o;
}

// 1 x new char[100] + delete[].
extern "C" NOINLINE void cxx_array() {
    char *a = new char[100];
    g_sink += (unsigned long)a;
    delete[] a;
}

// 1 x new Aligned (128 B, align 64) + sized aligned delete; 1 x new
// Aligned[3] (384 B) + aligned array delete.
extern "C" NOINLINE void cxx_aligned() {
    Aligned *a = new Aligned;
    g_sink += (unsigned long)a;
    delete a;
    Aligned *b = new Aligned[3];
    g_sink += (unsigned long)b;
    delete[] b;
}

// nothrow: new (nothrow) Obj (40 B), new (nothrow) char[50],
// new (nothrow) Aligned (128 B); the nothrow deletes called explicitly.
extern "C" NOINLINE void cxx_nothrow() {
    void *a = ::operator new(40, std::nothrow);
    void *b = ::operator new[](50, std::nothrow);
    void *c = ::operator new(128, std::align_val_t(64), std::nothrow);
    void *d = ::operator new[](256, std::align_val_t(64), std::nothrow);
    g_sink += (unsigned long)a + (unsigned long)b + (unsigned long)c + (unsigned long)d;
    ::operator delete(a, std::nothrow);
    ::operator delete[](b, std::nothrow);
    ::operator delete(c, std::align_val_t(64), std::nothrow);
    ::operator delete[](d, std::align_val_t(64), std::nothrow);
}

// A vector of 4000 ints grown by push_back: capacities 1, 2, 4, ... 4096
// (13 allocations, 4 * 8191 = 32764 bytes), all freed.
extern "C" NOINLINE void cxx_vector() {
    std::vector<int> v;
    for (int i = 0; i < 4000; i++) v.push_back(i);
    g_sink += v.size();
}

// One 200-character std::string (201 bytes), freed.
extern "C" NOINLINE void cxx_string() {
    std::string s(200, 'x');
    g_sink += s.size();
}

// malloc(300), calloc(10, 30), realloc to 600 (a free and an allocation),
// posix_memalign(64, 256), aligned_alloc(128, 512); all freed.
extern "C" NOINLINE void c_family() {
    void *a = malloc(300);
    void *b = calloc(10, 30);
    b = realloc(b, 600);
    void *c = nullptr;
    if (posix_memalign(&c, 64, 256) != 0) abort();
    void *d = aligned_alloc(128, 512);
    g_sink += (unsigned long)a + (unsigned long)b + (unsigned long)c + (unsigned long)d;
    free(a);
    free(b);
    free(c);
    free(d);
}

// A new of 2^62 bytes fails with std::bad_alloc (nothing allocated but
// the exception object, one malloc in __cxa_allocate_exception).
extern "C" NOINLINE void cxx_bad_alloc() {
    try {
        char *p = new char[(size_t)1 << 62];
        g_sink += (unsigned long)p;
        abort();
    } catch (const std::bad_alloc &) {
        g_sink += 1;
    }
}

// 1 x new Obj kept until exit.
static Obj *g_leak[1 << 16];
static int g_nleak;
extern "C" NOINLINE void cxx_leak() { g_leak[g_nleak++ & 0xffff] = new Obj; }

static void rep() {
    cxx_plain();
    cxx_array();
    cxx_aligned();
    cxx_nothrow();
    cxx_vector();
    cxx_string();
    c_family();
    cxx_leak();
}

// Bytes glibc's malloc holds for the program, asked of glibc itself
// (libc.so.6's mallinfo2, whatever allocator `malloc` reaches): in use in
// its arenas plus its mmapped chunks.
static size_t glibc_in_use() {
    static struct mallinfo2 (*info)(void);
    if (!info) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        if (!libc) abort();
        info = (struct mallinfo2 (*)(void))dlsym(libc, "mallinfo2");
        if (!info) abort();
    }
    struct mallinfo2 m = info();
    return m.uordblks + m.hblkhd;
}

// Keeps 256 blocks of 16 KiB from malloc, then 256 from new[], and prints
// by how much glibc's heap grew for each: 4 MiB or more when glibc served
// them, about nothing when another allocator did.
static void served() {
    static void *keep[512];
    const size_t n = 256, size = 16384;
    glibc_in_use();
    size_t before = glibc_in_use();
    for (size_t i = 0; i < n; i++) keep[i] = malloc(size);
    size_t mid = glibc_in_use();
    for (size_t i = n; i < 2 * n; i++) keep[i] = new char[size];
    size_t after = glibc_in_use();
    auto grew = [](size_t a, size_t b) { return b > a ? b - a : 0; };
    printf("served: glibc holds %zu of %zu malloc bytes, %zu of %zu new bytes\n",
           grew(before, mid), n * size, grew(mid, after), n * size);
    for (size_t i = 0; i < n; i++) free(keep[i]);
    for (size_t i = n; i < 2 * n; i++) delete[] (char *)keep[i];
}

static int g_reps;

static void *worker(void *) {
    for (int i = 0; i < g_reps; i++) rep();
    return nullptr;
}

int main(int argc, char **argv) {
    g_reps = argc > 1 ? atoi(argv[1]) : 100;
    pthread_t t[2];
    for (auto &th : t)
        if (pthread_create(&th, nullptr, worker, nullptr) != 0) abort();
    for (int i = 0; i < g_reps; i++) rep();
    if (argc > 2 && strcmp(argv[2], "bad_alloc") == 0) cxx_bad_alloc();
    for (auto &th : t) pthread_join(th, nullptr);
    if (argc > 2 && strcmp(argv[2], "served") == 0) served();
    printf("cxx_alloc done %lu\n", g_sink != 0 ? 1ul : 0ul);
    return 0;
}
