// Shared library for exit_now: dl_alloc(N) allocates N blocks of 48 bytes, kept.
#include <stdlib.h>

static volatile unsigned long sink;

__attribute__((noinline)) void dl_alloc(int n) {
    for (int i = 0; i < n; i++) sink += (unsigned long)malloc(48);
}
