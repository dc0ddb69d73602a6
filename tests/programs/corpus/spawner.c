// Starts children through every exec entry point, each child with an
// environment that lost the profiler (LD_PRELOAD replaced by another
// library or emptied, HEAPPROFD_* gone, or a fresh minimal environment),
// for the tests of exec inheritance (tests/tests/corpus.rs).
//
// Usage: spawner ALLOCATOR_SO  (absolute path of argv[0] required)
//   For method i (0..14) a child runs `spawner child 1000+i`, which makes
//   ten malloc(1000+i) calls (kept) and exits; the parent waits for each.
//   ALLOCATOR_SO is put in the children's LD_PRELOAD in place of the
//   profiler (e.g. libjemalloc.so.2), or "" for an empty LD_PRELOAD.
// Methods: 0 execve, 1 execv, 2 execvp, 3 execvpe, 4 execl, 5 execle,
//   6 execlp, 7 fexecve, 8 execveat, 9 posix_spawn, 10 posix_spawnp,
//   11 system, 12 popen, 13 vfork + execve.
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static void *volatile g_keep[16];

static int child(int size) {
    for (int i = 0; i < 10; i++) g_keep[i] = malloc(size);
    return 0;
}

static const char *g_self;
static char g_dir[4096];
static char g_base[256];
static char g_preload[4200];

// The environment a child is given: the profiler replaced.
static char *g_env[] = {g_preload, "PATH=/usr/bin:/bin", NULL};

// Makes the process's own environment lose the profiler (for the methods
// that pass `environ`).
static void lose_profiler(void) {
    setenv("LD_PRELOAD", g_preload + strlen("LD_PRELOAD="), 1);
    unsetenv("HEAPPROFD_SOCKET");
    unsetenv("HEAPPROFD_BLOCKING_INIT");
    char path[4200];
    snprintf(path, sizeof path, "%s:/usr/bin:/bin", g_dir);
    setenv("PATH", path, 1);
}

static void run(int m) {
    char size[16];
    snprintf(size, sizeof size, "%d", 1000 + m);
    char *argv[] = {(char *)g_self, "child", size, NULL};
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "exec %s child %s", g_self, size);
    if (m == 9 || m == 10) {
        pid_t pid;
        int rc = m == 9 ? posix_spawn(&pid, g_self, NULL, NULL, argv, g_env)
                        : posix_spawnp(&pid, g_base, NULL, NULL, argv, (lose_profiler(), environ));
        if (rc != 0) { fprintf(stderr, "spawn %d failed\n", m); exit(1); }
        waitpid(pid, NULL, 0);
        return;
    }
    if (m == 13) {
        pid_t pid = vfork();
        if (pid == 0) { execve(g_self, argv, g_env); _exit(127); }
        waitpid(pid, NULL, 0);
        return;
    }
    pid_t pid = fork();
    if (pid < 0) exit(1);
    if (pid > 0) { waitpid(pid, NULL, 0); return; }
    lose_profiler();
    int fd;
    switch (m) {
    case 0: execve(g_self, argv, g_env); break;
    case 1: execv(g_self, argv); break;
    case 2: execvp(g_base, argv); break;
    case 3: execvpe(g_base, argv, environ); break;
    case 4: execl(g_self, g_self, "child", size, (char *)NULL); break;
    case 5: execle(g_self, g_self, "child", size, (char *)NULL, g_env); break;
    case 6: execlp(g_base, g_base, "child", size, (char *)NULL); break;
    case 7: fd = open(g_self, O_RDONLY); fexecve(fd, argv, g_env); break;
    case 8: fd = open(g_dir, O_RDONLY | O_DIRECTORY); execveat(fd, g_base, argv, g_env, 0); break;
    case 11: _exit(system(cmd) == 0 ? 0 : 1);
    case 12: { FILE *f = popen(cmd, "r"); _exit(f && pclose(f) == 0 ? 0 : 1); }
    }
    perror("exec");
    _exit(127);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "child") == 0) return child(atoi(argv[2]));
    if (argc != 2 || argv[0][0] != '/') {
        fprintf(stderr, "usage: /abs/path/spawner ALLOCATOR_SO\n");
        return 2;
    }
    g_self = argv[0];
    const char *slash = strrchr(g_self, '/');
    snprintf(g_dir, sizeof g_dir, "%.*s", (int)(slash - g_self), g_self);
    snprintf(g_base, sizeof g_base, "%s", slash + 1);
    snprintf(g_preload, sizeof g_preload, "LD_PRELOAD=%s", argv[1]);
    for (int m = 0; m < 14; m++) run(m);
    printf("spawner done\n");
    return 0;
}
