// Prefetcher: every draw is handed out once, in order with one thread; parts are 64-byte
// aligned; a failed fill reaches Take with its Status and the samplers go on; a fully held ring
// fails instead of hanging; Close joins with slots still taken; bad settings are refused.
#include "core/prefetch.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "tests/testing.h"

using memoire::Code;
using memoire::Prefetcher;
using memoire::Status;

namespace {

// A fill that writes a running counter (int64) into part 0 and its complement into part 1.
Prefetcher::Fill Counter(std::shared_ptr<std::atomic<int64_t>> next) {
  return [next](int, uint8_t* const* p) {
    const int64_t v = next->fetch_add(1);
    std::memcpy(p[0], &v, 8);
    const int64_t w = ~v;
    std::memcpy(p[1], &w, 8);
    return Status::OK();
  };
}

}  // namespace

TEST(OneThreadHandsOutEveryDrawInOrder) {
  auto next = std::make_shared<std::atomic<int64_t>>(0);
  Prefetcher::Options o;
  o.depth = 3;
  o.threads = 1;
  o.part_bytes = {8, 100};
  std::unique_ptr<Prefetcher> p;
  CHECK(Prefetcher::Make(o, Counter(next), &p).ok());
  for (int64_t i = 0; i < 1000; ++i) {
    int slot = -1;
    CHECK(p->Take(&slot).ok());
    uint8_t* const* parts = p->parts(slot);
    CHECK(reinterpret_cast<uintptr_t>(parts[0]) % 64 == 0);
    CHECK(reinterpret_cast<uintptr_t>(parts[1]) % 64 == 0);
    int64_t v, w;
    std::memcpy(&v, parts[0], 8);
    std::memcpy(&w, parts[1], 8);
    CHECK(v == i);
    CHECK(w == ~i);
    p->Release(slot);
  }
  CHECK(p->taken() == 1000);
  p->Close();
  CHECK(p->filled() <= 1000 + o.depth);
}

TEST(ManyThreadsHandOutEveryDrawOnce) {
  auto next = std::make_shared<std::atomic<int64_t>>(0);
  Prefetcher::Options o;
  o.depth = 4;
  o.threads = 4;
  o.part_bytes = {8, 8};
  std::unique_ptr<Prefetcher> p;
  CHECK(Prefetcher::Make(o, Counter(next), &p).ok());
  std::set<int64_t> seen;
  for (int i = 0; i < 2000; ++i) {
    int slot = -1;
    CHECK(p->Take(&slot).ok());
    int64_t v;
    std::memcpy(&v, p->parts(slot)[0], 8);
    CHECK(seen.insert(v).second);
    p->Release(slot);
  }
  p->Close();
  // Draws are handed out in completion order: all but the last few in flight are seen.
  CHECK(seen.size() == 2000);
  CHECK(*seen.rbegin() < 2000 + o.depth);
}

TEST(FailedFillReachesTakeAndSamplersGoOn) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  Prefetcher::Options o;
  o.depth = 2;
  o.part_bytes = {8};
  std::unique_ptr<Prefetcher> p;
  CHECK(Prefetcher::Make(o,
                         [calls](int, uint8_t* const* parts) {
                           const int c = calls->fetch_add(1);
                           if (c % 2 == 1)
                             return Status(Code::kNotFound, "odd draw").With("key", c);
                           std::memcpy(parts[0], &c, sizeof c);
                           return Status::OK();
                         },
                         &p)
            .ok());
  for (int i = 0; i < 10; ++i) {
    int slot = -1;
    Status s = p->Take(&slot);
    CHECK(slot >= 0);
    if (i % 2 == 1) {
      CHECK(s.code() == Code::kNotFound);
      CHECK(s.detail("key") == i);
    } else {
      CHECK(s.ok());
    }
    p->Release(slot);
  }
}

TEST(FullyHeldRingFailsInsteadOfHanging) {
  auto next = std::make_shared<std::atomic<int64_t>>(0);
  Prefetcher::Options o;
  o.depth = 2;
  o.part_bytes = {8, 8};
  o.held_wait_ms = 10;
  std::unique_ptr<Prefetcher> p;
  CHECK(Prefetcher::Make(o, Counter(next), &p).ok());
  int a = -1, b = -1, c = -1;
  CHECK(p->Take(&a).ok());
  CHECK(p->Take(&b).ok());
  Status s = p->Take(&c);
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK(s.detail("held") == 2);
  CHECK(c == -1);
  p->Release(a);
  CHECK(p->Take(&c).ok());
  CHECK(c == a);
  // Close with slots still taken joins; their memory stays readable until destruction.
  p->Close();
  int64_t v;
  std::memcpy(&v, p->parts(b)[0], 8);
  CHECK(v >= 0);
  int d = -1;
  CHECK(p->Take(&d).code() == Code::kFailedPrecondition);
  p->Close();  // idempotent
}

TEST(BadSettingsAreRefused) {
  auto next = std::make_shared<std::atomic<int64_t>>(0);
  std::unique_ptr<Prefetcher> p;
  Prefetcher::Options o;
  o.depth = 0;
  CHECK(Prefetcher::Make(o, Counter(next), &p).code() == Code::kInvalidArgument);
  o.depth = 2;
  o.threads = 3;
  CHECK(Prefetcher::Make(o, Counter(next), &p).code() == Code::kInvalidArgument);
  o.threads = 1;
  CHECK(Prefetcher::Make(o, Prefetcher::Fill(), &p).code() == Code::kInvalidArgument);
  CHECK(p == nullptr);
}

TEST_MAIN()
