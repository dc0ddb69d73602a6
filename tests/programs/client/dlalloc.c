// A library that is dlopen'ed and allocates, with TLS of its own (which
// makes glibc grow the DTV, and __tls_get_addr allocate).
#include <stdlib.h>
#include <string.h>
static __thread char tls_buf[4096];
static __thread unsigned long tls_count;
unsigned long dl_work(unsigned long seed) {
  unsigned long sum = 0;
  for (int i = 0; i < 100; i++) {
    size_t n = 16 + (seed * 31 + i) % 3000;
    char *p = malloc(n);
    memset(p, (int)(i & 0x7f), n);
    tls_buf[i % sizeof tls_buf] = p[n / 2];
    sum += (unsigned char)tls_buf[i % sizeof tls_buf];
    p = realloc(p, n * 2);
    free(p);
  }
  tls_count++; // TLS use; its value depends on unload timing, so not returned
  return sum;
}
