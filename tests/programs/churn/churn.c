/* A program that keeps loading and unloading libraries and starting
 * threads: the daemon's memory under a stream of new modules, threads and
 * stacks (docs/PERFORMANCE.md, issue 11; scripts/bench-daemon-memory.sh;
 * tests/tests/record_churn.rs).
 *
 * Usage: churn LIBDIR NLIBS ROUNDS|Ns [PAUSE_US [fresh]]
 * Loads LIBDIR/libplugin_<k>.so (k = 0..NLIBS-1) in turn, three loaded at
 * a time (so their addresses move), for ROUNDS rounds or N seconds. Each
 * round: dlopen the next library, call its churn_work on this thread and
 * on two new threads (joined), dlclose the oldest. The first call of each
 * library keeps a 64 KiB block for good (NLIBS blocks in all). Prints the
 * rounds done, and on stderr the latency of its dlclose calls. PAUSE_US:
 * sleep that long after each round (default 0).
 * `fresh`: every round loads a new copy of the library, written to LIBDIR
 * with its build id changed (and removed once loaded), so the stream of
 * distinct modules never ends (a program that generates code as shared
 * objects). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WINDOW 3
#define THREADS 2

typedef void *(*work_fn)(unsigned, int);

struct job {
    work_fn work;
    unsigned round;
};

static void *thread_main(void *arg) {
    struct job *j = arg;
    j->work(j->round, 0);
    return NULL;
}

/* Writes a copy of the library at `path` to `out` whose GNU build id
 * (NT_GNU_BUILD_ID, "GNU") starts with `serial`. Returns 0 on success. */
static int write_fresh_copy(const char *path, const char *out, unsigned long serial) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    /* The note: namesz 4, descsz >= 8, type 3, "GNU\0", then the id. */
    static const unsigned char hdr[] = {4, 0, 0, 0};
    size_t at = 0;
    for (size_t i = 0; i + 16 + 8 <= n; i += 4) {
        if (memcmp(buf + i, hdr, 4) == 0 && buf[i + 8] == 3 && buf[i + 9] == 0 &&
            memcmp(buf + i + 12, "GNU", 4) == 0 && (unsigned char)buf[i + 4] >= 8) {
            at = i + 16;
            break;
        }
    }
    if (at == 0) return -1;
    memcpy(buf + at, &serial, sizeof serial);
    FILE *o = fopen(out, "wb");
    if (!o) return -1;
    size_t w = fwrite(buf, 1, n, o);
    return fclose(o) == 0 && w == n ? 0 : -1;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* dlclose's latency (a profiler may make it wait), reported on stderr. */
static unsigned long dlclose_calls;
static double dlclose_total, dlclose_max;

static void timed_dlclose(void *h) {
    double t = now();
    dlclose(h);
    double d = now() - t;
    dlclose_calls++;
    dlclose_total += d;
    if (d > dlclose_max) dlclose_max = d;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: churn LIBDIR NLIBS ROUNDS|Ns [PAUSE_US [fresh]]\n");
        return 2;
    }
    const char *dir = argv[1];
    int nlibs = atoi(argv[2]);
    long pause_us = argc >= 5 ? atol(argv[4]) : 0;
    int fresh = argc == 6 && strcmp(argv[5], "fresh") == 0;
    size_t arglen = strlen(argv[3]);
    int timed = arglen > 0 && argv[3][arglen - 1] == 's';
    double seconds = timed ? atof(argv[3]) : 0;
    unsigned long rounds = timed ? 0 : strtoul(argv[3], NULL, 10);
    if (nlibs <= 0) {
        fprintf(stderr, "churn: NLIBS must be positive\n");
        return 2;
    }
    void **kept = calloc((size_t)nlibs, sizeof *kept);
    void *loaded[WINDOW] = {0};
    double end = now() + seconds;
    unsigned long round = 0;
    for (; timed ? now() < end : round < rounds; round++) {
        int k = (int)(round % (unsigned long)nlibs);
        char path[4096];
        snprintf(path, sizeof path, "%s/libplugin_%d.so", dir, k);
        if (fresh) {
            char copy[4096];
            snprintf(copy, sizeof copy, "%s/fresh_%d_%lu.so", dir, (int)getpid(), round);
            if (write_fresh_copy(path, copy, round + 1) != 0) {
                fprintf(stderr, "churn: cannot write %s\n", copy);
                return 1;
            }
            memcpy(path, copy, sizeof copy);
        }
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (fresh) unlink(path);
        if (!h) {
            fprintf(stderr, "churn: %s\n", dlerror());
            return 1;
        }
        work_fn work = (work_fn)dlsym(h, "churn_work");
        if (!work) {
            fprintf(stderr, "churn: no churn_work in %s\n", path);
            return 1;
        }
        void *block = work((unsigned)round, kept[k] == NULL);
        if (block) kept[k] = block;
        pthread_t t[THREADS];
        struct job jobs[THREADS];
        for (int i = 0; i < THREADS; i++) {
            jobs[i] = (struct job){work, (unsigned)round + 1 + (unsigned)i};
            if (pthread_create(&t[i], NULL, thread_main, &jobs[i]) != 0) {
                fprintf(stderr, "churn: pthread_create failed\n");
                return 1;
            }
        }
        for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
        int slot = (int)(round % WINDOW);
        if (loaded[slot]) timed_dlclose(loaded[slot]);
        loaded[slot] = h;
        if (pause_us > 0) {
            struct timespec p = {pause_us / 1000000, (pause_us % 1000000) * 1000};
            nanosleep(&p, NULL);
        }
    }
    for (int i = 0; i < WINDOW; i++)
        if (loaded[i]) timed_dlclose(loaded[i]);
    printf("rounds %lu\n", round);
    fprintf(stderr, "churn: dlclose %lu calls, mean %.1f us, max %.1f us\n", dlclose_calls,
            dlclose_calls ? dlclose_total / (double)dlclose_calls * 1e6 : 0.0, dlclose_max * 1e6);
    return 0;
}
