// A program that allocates, then execs itself: memory the first image
// allocated is thrown away by the exec and must not stay "unreleased".
//
// Usage: exec_twice          phase 1 (50 x malloc(2000) kept, 30 x
//                            malloc(500) freed), then exec of
//                            /proc/self/exe with `after`;
//        exec_twice after    phase 2: 20 x malloc(3000) kept, 10 x
//                            malloc(700) freed, prints a line;
//        exec_twice before   phase 1 only, then exit (the reference run
//                            of the first image for heaptrack, which does
//                            not follow an exec).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile g_keep[64];

__attribute__((noinline)) static void phase(int kept, size_t kept_size, int freed, size_t freed_size) {
    for (int i = 0; i < kept; i++) g_keep[i] = malloc(kept_size);
    for (int i = 0; i < freed; i++) {
        void *p = malloc(freed_size);
        g_keep[63] = p;
        free(p);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "after") == 0) {
        phase(20, 3000, 10, 700);
        printf("exec_twice after\n");
        return 0;
    }
    phase(50, 2000, 30, 500);
    if (argc > 1 && strcmp(argv[1], "before") == 0) return 0;
    execl("/proc/self/exe", argv[0], "after", (char *)NULL);
    perror("exec_twice: execl");
    return 1;
}
