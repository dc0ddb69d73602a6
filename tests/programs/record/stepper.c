// stepper: runs the commands it reads from stdin, one per line, and answers
// "ok <command>" on stdout after each (so a test knows how far it got):
//   grow N      N blocks of 1000 bytes from grow_site, kept
//   big         10 blocks of 100000 bytes from peak_site, kept
//   free-big    frees peak_site's blocks
//   small       20 blocks of 1000 bytes from after_peak_site, kept
//   ignore-int  ignores SIGINT from now on
//   pause       waits for a signal (SIGINT ends the process unless ignored)
// Exits 0 at the end of its input.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile unsigned long sink;
static void *big[10];

__attribute__((noinline)) void grow_site(int n) {
    for (int i = 0; i < n; i++) sink += (unsigned long)malloc(1000);
}

__attribute__((noinline)) void peak_site(void) {
    for (int i = 0; i < 10; i++) big[i] = malloc(100000);
}

__attribute__((noinline)) void after_peak_site(void) {
    for (int i = 0; i < 20; i++) sink += (unsigned long)malloc(1000);
}

int main(void) {
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "grow ", 5)) grow_site(atoi(line + 5));
        else if (!strcmp(line, "big")) peak_site();
        else if (!strcmp(line, "free-big")) for (int i = 0; i < 10; i++) free(big[i]);
        else if (!strcmp(line, "small")) after_peak_site();
        else if (!strcmp(line, "ignore-int")) signal(SIGINT, SIG_IGN);
        else if (!strcmp(line, "pause")) {
            printf("ok pause\n");
            fflush(stdout);
            for (;;) pause();
        } else {
            fprintf(stderr, "stepper: unknown command `%s`\n", line);
            return 2;
        }
        printf("ok %s\n", line);
        fflush(stdout);
    }
    return 0;
}
