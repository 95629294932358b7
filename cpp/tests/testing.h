// A tiny test harness: no downloads, runs under sanitizers. A failed CHECK prints and counts;
// main returns non-zero when any check failed.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace memoire_test {

inline int& Failures() { static int n = 0; return n; }
inline std::vector<std::pair<std::string, std::function<void()>>>& Registry() {
  static std::vector<std::pair<std::string, std::function<void()>>> r;
  return r;
}
struct Register {
  Register(const char* name, std::function<void()> f) { Registry().emplace_back(name, f); }
};

inline int RunAll() {
  for (auto& [name, f] : Registry()) {
    int before = Failures();
    f();
    std::printf("%s %s\n", Failures() == before ? "PASS" : "FAIL", name.c_str());
  }
  std::printf("%d checks failed\n", Failures());
  return Failures() == 0 ? 0 : 1;
}

}  // namespace memoire_test

#define TEST(name)                                                       \
  static void name();                                                    \
  static memoire_test::Register name##_reg(#name, name);                 \
  static void name()

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::printf("  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);    \
      ++memoire_test::Failures();                                               \
    }                                                                           \
  } while (0)

#define TEST_MAIN() \
  int main() { return memoire_test::RunAll(); }
