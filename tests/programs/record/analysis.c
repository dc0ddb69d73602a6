// analysis: known workloads for the report's analyses (tests/tests/record_analysis.rs).
//   analysis diff MIB   steady_site keeps 1 MiB, grow_site keeps MIB MiB
//                       (64 KiB blocks); two runs with different MIB differ
//                       by exactly that in grow_site
//   analysis temp N     long_site keeps N blocks of 32 bytes, then
//                       temp_site makes N allocations of 32 bytes, each freed
//                       before the next (temporary), then long_site's are freed
//   analysis steps      runs commands from stdin, one per line, answering
//                       "ok <command>" after each:
//                         alloc100  peak_site allocates 100 MiB (1 MiB blocks)
//                         free100   frees them
//                         alloc10   after_peak_site allocates 10 MiB, kept
//                         grow2     16 times: fast_site keeps 256 KiB, then
//                                   slow_site keeps 64 KiB (between any two
//                                   dumps fast_site grows more, if both grow)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile unsigned long sink;
static void *blocks[100];

__attribute__((noinline)) void steady_site(void) {
    for (int i = 0; i < 16; i++) sink += (unsigned long)malloc(64 << 10);
}

__attribute__((noinline)) void grow_site(int mib) {
    for (int i = 0; i < mib * 16; i++) sink += (unsigned long)malloc(64 << 10);
}

__attribute__((noinline)) void long_site(void **keep, long n) {
    for (long i = 0; i < n; i++) keep[i] = malloc(32);
}

__attribute__((noinline)) void temp_site(long n) {
    for (long i = 0; i < n; i++) {
        char *p = malloc(32);
        // Keep the compiler from eliding the malloc/free pair.
        __asm__ volatile("" : : "r"(p) : "memory");
        p[0] = (char)i;
        sink += (unsigned long)p[0];
        free(p);
    }
}

__attribute__((noinline)) void peak_site(void) {
    for (int i = 0; i < 100; i++) {
        blocks[i] = malloc(1 << 20);
        memset(blocks[i], 1, 4096);
    }
}

__attribute__((noinline)) void after_peak_site(void) {
    for (int i = 0; i < 10; i++) sink += (unsigned long)malloc(1 << 20);
}

__attribute__((noinline)) void fast_site(void) { sink += (unsigned long)malloc(256 << 10); }

__attribute__((noinline)) void slow_site(void) { sink += (unsigned long)malloc(64 << 10); }

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "diff")) {
        steady_site();
        grow_site(atoi(argv[2]));
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "temp")) {
        long n = atol(argv[2]);
        void **keep = calloc((size_t)n, sizeof *keep);
        long_site(keep, n);
        temp_site(n);
        for (long i = 0; i < n; i++) free(keep[i]);
        free(keep);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "steps")) {
        char line[64];
        while (fgets(line, sizeof line, stdin)) {
            line[strcspn(line, "\n")] = 0;
            if (!strcmp(line, "alloc100")) peak_site();
            else if (!strcmp(line, "free100")) for (int i = 0; i < 100; i++) free(blocks[i]);
            else if (!strcmp(line, "alloc10")) after_peak_site();
            else if (!strcmp(line, "grow2")) {
                for (int i = 0; i < 16; i++) {
                    fast_site();
                    slow_site();
                }
            }
            printf("ok %s\n", line);
            fflush(stdout);
        }
        return 0;
    }
    fprintf(stderr, "usage: analysis diff MIB | temp N | steps\n");
    return 2;
}
