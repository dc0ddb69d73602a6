// The shared library of walk_cxx.cpp: a template and a virtual call
// between the program's frames, so the walk crosses an object boundary
// twice (program -> libwalklib.so -> program).
#include "walklib.h"

namespace walklib {

template <int N>
__attribute__((noinline)) int relay(Visitor &v, int x) {
  int r = relay<N - 1>(v, x + 1);
  asm volatile("" ::: "memory");
  return r + 1;
}

template <>
__attribute__((noinline)) int relay<0>(Visitor &v, int x) {
  int r = v.visit(x);
  asm volatile("" ::: "memory");
  return r + 1;
}

int run(Visitor &v, int x) { return relay<2>(v, x) + 1; }

}  // namespace walklib
