// A non-PIE program that takes the addresses of malloc, calloc, realloc
// and free (its executable then carries canonical PLT entries for them and
// a global lookup of `malloc` returns the program's own entry, as in
// Debian's /usr/bin/python3), and allocates through those pointers.
//
// Build: gcc -O0 -g -no-pie -fno-pie. Usage: nopie_addr [N] (default 2000):
// N x malloc(64 + i % 512) through the pointer, every other one freed;
// N / 10 x calloc(4, 100) then realloc to 800, freed.
#include <stdio.h>
#include <stdlib.h>

void *(*volatile g_malloc)(size_t) = malloc;
void *(*volatile g_calloc)(size_t, size_t) = calloc;
void *(*volatile g_realloc)(void *, size_t) = realloc;
void (*volatile g_free)(void *) = free;
static void *volatile g_keep[1 << 16];

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    for (int i = 0; i < n; i++) {
        void *p = g_malloc(64 + i % 512);
        if (i % 2) g_free(p);
        else g_keep[i & 0xffff] = p;
    }
    for (int i = 0; i < n / 10; i++) {
        void *p = g_calloc(4, 100);
        p = g_realloc(p, 800);
        g_free(p);
    }
    printf("nopie_addr done\n");
    return 0;
}
