// A long-running C++ target for `record --pid` tests: worker threads
// churning std::map/std::string/std::vector (in cxx_worker_alloc), and the
// stdin commands of target.c: `work N` (prints "sum=<checksum>") and `quit`.
#include <atomic>
#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

static std::atomic<bool> stop_flag{false};

__attribute__((noinline)) static size_t cxx_worker_alloc(uint64_t seed) {
  std::map<uint64_t, std::string> m;
  for (int i = 0; i < 64; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    m[seed % 1000] = std::string(16 + seed % 300, 'a' + i % 26);
  }
  return m.size();
}

static void worker(int id) {
  uint64_t seed = id + 1;
  size_t total = 0;
  while (!stop_flag.load()) {
    total += cxx_worker_alloc(seed++);
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  (void)total;
}

__attribute__((noinline)) static uint64_t cxx_target_work(long n) {
  std::vector<std::string> v;
  uint64_t x = 0x9E3779B97F4A7C15ull, sum = 0;
  for (long i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v.emplace_back(8 + x % 100, char('a' + x % 26));
    if (v.size() > 500) {
      for (auto &s : v) sum = sum * 131 + s.size() + (unsigned char)s[0];
      v.clear();
    }
  }
  for (auto &s : v) sum = sum * 131 + s.size() + (unsigned char)s[0];
  return sum;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; i++) ts.emplace_back(worker, i);
  std::cout << "ready" << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.rfind("work ", 0) == 0) {
      std::cout << "sum=" << cxx_target_work(std::stol(line.substr(5))) << std::endl;
    } else if (line == "quit") {
      break;
    } else {
      std::cout << "unknown " << line << std::endl;
    }
  }
  stop_flag = true;
  for (auto &t : ts) t.join();
  std::cout << "bye" << std::endl;
  return 0;
}
