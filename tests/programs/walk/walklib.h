// The interface between walk_cxx.cpp and libwalklib.so.
#pragma once

namespace walklib {

struct Visitor {
  virtual int visit(int x) = 0;
  virtual ~Visitor() = default;
};

// Calls v.visit() through three template frames of the library.
__attribute__((visibility("default"))) int run(Visitor &v, int x);

}  // namespace walklib
