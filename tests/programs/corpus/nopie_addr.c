// A non-PIE program that takes the address of malloc (its executable then
// carries a canonical PLT entry for it and a global lookup of `malloc`
// returns the program's own entry, as in Debian's /usr/bin/python3) and
// allocates through that pointer; free, calloc and realloc are called
// directly (issue 10's ten-line repro).
//
// Build: gcc -O0 -g -no-pie -fno-pie. Usage: nopie_addr [N] (default 2000):
// after 200 ms, N x malloc(64 + i % 512) through the pointer, every other
// one freed; N / 10 x calloc(4, 100) then realloc to 800, freed. (The
// pause lets a client that refuses such a program from another thread, as
// issue 10's did, do so before the work starts: otherwise whether it saw
// the allocations was a race.)
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *volatile g_keep[1 << 16];

int main(int argc, char **argv) {
    // Taken in code (not a static initializer, which the linker turns into
    // a data relocation): this is what makes the canonical PLT entry.
    void *(*volatile g_malloc)(size_t) = malloc;
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    usleep(200 * 1000);
    for (int i = 0; i < n; i++) {
        void *p = g_malloc(64 + i % 512);
        if (i % 2) free(p);
        else g_keep[i & 0xffff] = p;
    }
    for (int i = 0; i < n / 10; i++) {
        void *p = calloc(4, 100);
        g_keep[0xffff] = p;
        p = realloc(p, 800);
        free(p);
    }
    printf("nopie_addr done\n");
    return 0;
}
