// many_stacks N: N blocks of 32 bytes (kept), each allocated at a different
// recursion depth (0 .. N-1), so the profile has N distinct call stacks and
// the trace's interned callstacks grow as N^2 (a trace too big for a tiny
// file system).
#include <stdlib.h>

static volatile unsigned long sink;

__attribute__((noinline)) void stack_leaf(void) { sink += (unsigned long)malloc(32); }

__attribute__((noinline)) int stack_recurse(int n) {
    volatile int d = n;  // read after the call: no tail call, no loop
    if (n == 0) {
        stack_leaf();
        return 0;
    }
    int r = stack_recurse(n - 1);
    return r + d;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 500;
    for (int i = 0; i < n; i++) stack_recurse(i);
    return 0;
}
