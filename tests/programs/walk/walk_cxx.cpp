// The in-process walk from C++ (tests/tests/stack_walk.rs): main ->
// Outer::go -> walklib::run (libwalklib.so, template frames) ->
// Walker::visit (virtual, back in the program) -> std::function lambda ->
// Walker::walk_now, which walks its own stack and prints "FRAME type pc"
// lines, then "END" or "FAIL reason". Built -O2 -fomit-frame-pointer.
#include <heapprofd.h>

#include <cinttypes>
#include <cstdio>
#include <functional>

#include "walklib.h"

namespace {

struct Seen {
  int n = 0, ended = 0, reason = 0, biased = -1;
  uint64_t pcs[HEAPPROFD_WALK_MAX_FRAMES];
  int types[HEAPPROFD_WALK_MAX_FRAMES];
};

const heapprofd_stack_callbacks kCallbacks = {
    [](uint64_t, int biased, void *u) { static_cast<Seen *>(u)->biased = biased; },
    [](int type, uint64_t pc, void *u) {
      auto *s = static_cast<Seen *>(u);
      if (s->n < HEAPPROFD_WALK_MAX_FRAMES) {
        s->types[s->n] = type;
        s->pcs[s->n++] = pc;
      }
    },
    [](uint64_t, void *u) { static_cast<Seen *>(u)->ended = 1; },
    [](uint64_t, int reason, void *u) { static_cast<Seen *>(u)->reason = reason; },
};

volatile int sink;

struct Walker : walklib::Visitor {
  __attribute__((noinline)) void walk_now() {
    Seen s;
    int rc = heapprofd_walk_stack(nullptr, &kCallbacks, &s);
    std::printf("RC %d BIASED %d\n", rc, s.biased);
    for (int i = 0; i < s.n; i++) std::printf("FRAME %d %" PRIx64 "\n", s.types[i], s.pcs[i]);
    if (s.ended) std::printf("END\n");
    else std::printf("FAIL %d\n", s.reason);
    sink++;
  }
  __attribute__((noinline)) int visit(int x) override {
    std::function<void()> f = [this] { walk_now(); };
    if (x) f();
    return x + sink;
  }
};

struct Outer {
  __attribute__((noinline)) int go(int x) {
    Walker w;
    int r = walklib::run(w, x);
    sink += r;
    return r;
  }
};

}  // namespace

int main(int argc, char **) {
  if (heapprofd_walk_prepare() != 0) return 1;
  Outer o;
  int r = o.go(argc);
  std::fflush(stdout);
  return r > 0 ? 0 : 1;
}
