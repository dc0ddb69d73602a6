// sites (C++): allocations through the standard library whose site must be
// the caller, not operator new: fill_vector grows a std::vector<int> by
// push_back, make_strings builds long std::strings, new_objects uses new.
#include <string>
#include <vector>

struct Node { long a[8]; };

static volatile unsigned long sink;

__attribute__((noinline)) void fill_vector() {
    std::vector<int> v;
    for (int i = 0; i < 200000; i++) v.push_back(i);
    sink += v.size();
}

__attribute__((noinline)) void make_strings() {
    for (int i = 0; i < 2000; i++) {
        std::string s(100 + i % 50, 'x');
        sink += s.size();
    }
}

__attribute__((noinline)) void new_objects() {
    for (int i = 0; i < 3000; i++) {
        Node *n = new Node();
        sink += (unsigned long)n;
        delete n;
    }
}

int main() {
    fill_vector();
    make_strings();
    new_objects();
    return 0;
}
