// exit_now N [LIB [SLEEP_MS [exit|exec|_exit]]]: allocates N blocks of 64 bytes (kept)
// in alloc_then_exit and calls _exit(0) at once, so the last samples are
// still in the ring buffer when the process is gone. With LIB, first
// dlopen()s it and calls its dl_alloc(N) (N more blocks, from code the daemon
// has not seen in the maps it read at the handshake), then sleeps SLEEP_MS
// (default 0) before the main allocations. With `exit`, ends with exit(0)
// (destructors run) instead of _exit(0); with `exec`, execs /bin/true.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) void alloc_then_exit(int n) {
    for (int i = 0; i < n; i++) sink += (unsigned long)malloc(64);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int n = atoi(argv[1]);
    if (argc > 2) {
        void *h = dlopen(argv[2], RTLD_NOW);
        if (!h) {
            fprintf(stderr, "exit_now: %s\n", dlerror());
            return 2;
        }
        void (*dl_alloc)(int) = (void (*)(int))dlsym(h, "dl_alloc");
        if (!dl_alloc) return 2;
        dl_alloc(n);
        long ms = argc > 3 ? atol(argv[3]) : 0;
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    alloc_then_exit(n);
    if (argc > 4 && strcmp(argv[4], "exec") == 0) {
        execl("/bin/true", "true", (char *)NULL);
        return 3;
    }
    if (argc > 4 && strcmp(argv[4], "exit") == 0) exit(0);
    _exit(0);
}
