/* Test program for the unwinder's gdb comparison tests.
 *
 * main -> helper (always inlined) -> recurse(depth) ... -> recurse(0) ->
 * qsort (libc, with its inline frames) -> cmp -> leaf. The tests put a
 * breakpoint on `leaf`. argv[1] is the recursion depth (default 10).
 */
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline, noclone))

volatile int sink;

NOINLINE void leaf(int x) {
    sink = x;
    __asm__ volatile("" ::: "memory");
}

static int cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    leaf(x + y);
    return (x > y) - (x < y);
}

NOINLINE int recurse(int n, int *arr, int len) {
    if (n <= 0) {
        qsort(arr, len, sizeof(int), cmp);
        return arr[0];
    }
    int r = recurse(n - 1, arr, len);
    sink = r;
    return r + n;
}

static inline __attribute__((always_inline)) int helper(int depth, int *arr) {
    return recurse(depth, arr, 8) * 3;
}

int main(int argc, char **argv) {
    int depth = argc > 1 ? atoi(argv[1]) : 10;
    int arr[8] = {5, 3, 7, 1, 8, 2, 6, 4};
    printf("%d\n", helper(depth, arr));
    return 0;
}
