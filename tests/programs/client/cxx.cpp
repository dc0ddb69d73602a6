// C++: new/delete, containers, exceptions (whose objects are malloc'ed by
// __cxa_allocate_exception), from 8 threads.
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
static uint64_t work(int id) {
  uint64_t sum = 0;
  for (int round = 0; round < 200; round++) {
    std::vector<std::string> v;
    for (int i = 0; i < 100; i++) v.push_back(std::string(1 + (id * 7 + i) % 300, char('a' + i % 26)));
    std::map<int, std::unique_ptr<int[]>> m;
    for (int i = 0; i < 50; i++) { m[i].reset(new int[1 + i]); m[i][0] = i; }
    for (auto &kv : m) sum += kv.second[0];
    for (auto &s : v) sum += s.size();
    try {
      if (round % 2 == 0) throw std::runtime_error(std::string(100 + round, 'x'));
    } catch (const std::exception &e) {
      sum += std::string(e.what()).size();
    }
    auto *big = new std::vector<double>(1000 + round);
    sum += big->size();
    delete big;
  }
  return sum;
}
int main() {
  std::vector<std::thread> ts;
  std::vector<uint64_t> out(8);
  for (int i = 0; i < 8; i++) ts.emplace_back([i, &out] { out[i] = work(i); });
  for (auto &t : ts) t.join();
  uint64_t total = 0;
  for (auto x : out) total += x;
  std::printf("cxx checksum=%llu\n", (unsigned long long)total);
  return 0;
}
