// A known sequence of allocations with sizes nothing else uses (100000 to
// 999999 bytes), every block freed. At interval 1 the receiver must see
// exactly these samples and a free for each.
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  void *p[1000];
  for (int i = 0; i < 1000; i++) { p[i] = malloc(100000 + i); memset(p[i], 1, 16); }
  for (int i = 0; i < 1000; i++) free(p[i]);
  for (int i = 0; i < 200; i++) p[i] = calloc(1, 200000 + i);
  for (int i = 0; i < 200; i++) p[i] = realloc(p[i], 300000 + i);
  for (int i = 0; i < 200; i++) free(p[i]);
  for (int i = 0; i < 50; i++) if (posix_memalign(&p[i], 64, 400000 + i)) return 1;
  for (int i = 0; i < 50; i++) free(p[i]);
  for (int i = 0; i < 10; i++) p[i] = memalign(128, 500000 + i);
  for (int i = 10; i < 20; i++) p[i] = aligned_alloc(256, 600000 + (i - 10) * 256);
  for (int i = 20; i < 30; i++) p[i] = valloc(700000 + i);
  for (int i = 30; i < 40; i++) p[i] = pvalloc(800000 + i);
  for (int i = 40; i < 50; i++) p[i] = reallocarray(NULL, 10, 90000 + i);
  for (int i = 0; i < 50; i++) free(p[i]);
  printf("exact ok\n");
  return 0;
}
