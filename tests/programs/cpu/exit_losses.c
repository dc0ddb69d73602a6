/* Samples a thread loses after its last sample, just before the process
 * exits (tests/tests/cpu_time.rs). Event 9, "exit-losses": the main thread
 * makes N recorded requests; then, at exit, the disabled callback of heap
 * "exitpool" (run by the client's destructor, inside the client) makes 3
 * more, which the client cannot record (the thread is inside it: counted
 * as lost). No sample follows them: the client must send them at exit.
 *
 *   exit_losses N   prints "recorded M" from main and "at_exit 3 lost L"
 *                   from the callback (record with --heaps libc.malloc,exitpool) */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "heapprofd.h"

#define TAG 9

static void on_disabled(void *data, const AHeapProfileDisableCallbackInfo *info) {
  (void)data;
  (void)info;
  int lost = 0;
  for (int i = 0; i < 3; i++) lost += heapprofd_request_stack(NULL, TAG) != 0;
  char line[64];
  int n = snprintf(line, sizeof line, "at_exit 3 lost %d\n", lost);
  if (write(1, line, (size_t)n) < 0) _exit(3);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 5;
  if (heapprofd_register_event(TAG, "exit-losses") != 0) return 1;
  AHeapInfo *info = AHeapInfo_create("exitpool");
  if (!info || !AHeapInfo_setDisabledCallback(info, on_disabled, NULL)) return 1;
  if (AHeapProfile_registerHeap(info) == 0) return 1;
  /* The profile may start after main: wait for the first recorded sample
   * (bounded: 20 s). */
  int recorded = 0;
  for (int i = 0; i < 20000 && !recorded; i++) {
    recorded = heapprofd_request_stack(NULL, TAG) == 0;
    if (!recorded) usleep(1000);
  }
  for (int i = 1; i < n; i++) recorded += heapprofd_request_stack(NULL, TAG) == 0;
  printf("recorded %d\n", recorded);
  fflush(stdout);
  return 0;
}
