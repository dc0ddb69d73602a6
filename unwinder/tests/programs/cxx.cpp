// Test program for the unwinder's gdb comparison tests: C++ inlining,
// templates, lambdas, exceptions and threads. argv[1] picks the scenario;
// the tests put a breakpoint on `leaf`.
//   dtor:   leaf runs in a destructor while an exception unwinds the frame
//   catch:  leaf runs in a catch handler (often in .text.unlikely / .cold)
//   thread: leaf runs in a std::sort comparator inside a std::thread
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#define NOINLINE __attribute__((noinline))

volatile int sink;

extern "C" NOINLINE void leaf(int x) {
    sink = x;
    __asm__ volatile("" ::: "memory");
}

namespace app {

struct Guard {
    int v;
    ~Guard() { leaf(v); }
};

template <typename T>
struct Holder {
    T value;
    __attribute__((always_inline)) inline T get() const { return value; }
};

NOINLINE void thrower(int x) {
    Guard g{x};
    if (x > 0) throw std::runtime_error("boom");
    sink = 1;
}

NOINLINE void throw_plain(int x) {
    if (x > 0) throw std::runtime_error("boom");
    sink = 1;
}

NOINLINE int catcher(int x) {
    Holder<int> h{x};
    try {
        throw_plain(x);
    } catch (const std::exception &e) {
        leaf(h.get() + static_cast<int>(std::strlen(e.what())));
        return 1;
    }
    return 0;
}

template <typename T>
NOINLINE T sorted_sum(std::vector<T> v) {
    std::sort(v.begin(), v.end(), [](const T &a, const T &b) {
        leaf(static_cast<int>(a));
        return a < b;
    });
    T s{};
    for (auto &x : v) s += x;
    return s;
}

}  // namespace app

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "catch";
    if (std::strcmp(mode, "dtor") == 0) {
        sink = 100;
        try {
            app::thrower(7);
        } catch (...) {
        }
    } else if (std::strcmp(mode, "catch") == 0) {
        sink = 101;
        std::printf("%d\n", app::catcher(3));
    } else {
        long r = 0;
        std::thread t([&] { r = app::sorted_sum(std::vector<long>{5, 1, 4, 2, 3}); });
        t.join();
        std::printf("%ld\n", r);
    }
    return 0;
}
