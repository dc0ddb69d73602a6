/* The library dlwalk.c dlopens after preparing the walk: two frames of
 * its own between the program's main and its walk (tests/tests/
 * stack_walk.rs). The program passes the function that walks (its own
 * heapprofd.h copy is the prepared one). */

typedef int (*walk_fn)(void);

__attribute__((noinline, visibility("default"))) int dlwalk_inner(walk_fn walk) {
  int rc = walk();
  __asm__ volatile("" ::: "memory"); /* not a tail call */
  return rc;
}

__attribute__((noinline, visibility("default"))) int dlwalk_outer(walk_fn walk) {
  int rc = dlwalk_inner(walk);
  __asm__ volatile("" ::: "memory");
  return rc;
}
