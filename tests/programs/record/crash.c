// crash MODE N: allocates N blocks of 100 bytes (kept) in alloc_before_crash,
// then: MODE=segv writes through a null pointer, abort calls abort(),
// exit7 calls _exit(7), return returns 0 from main. N may be 0.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) void alloc_before_crash(int n) {
    for (int i = 0; i < n; i++) sink += (unsigned long)malloc(100);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    alloc_before_crash(atoi(argv[2]));
    if (!strcmp(argv[1], "segv")) *(volatile int *)(sink & 0) = 1;
    if (!strcmp(argv[1], "abort")) abort();
    if (!strcmp(argv[1], "exit7")) _exit(7);
    return 0;
}
