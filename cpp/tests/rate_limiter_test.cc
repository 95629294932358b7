// RateLimiter (core/rate_limiter.h): Reverb's stage 1 and 2 rules, the cursor kept in its band
// by two threads, timeouts and Cancel.
#include "core/rate_limiter.h"

#include <atomic>
#include <thread>

#include "tests/testing.h"

using memoire::RateLimiter;

static std::unique_ptr<RateLimiter> Make(double spi, int64_t min_size, double lo, double hi) {
  RateLimiter::Options o;
  o.samples_per_insert = spi;
  o.min_size_to_sample = min_size;
  o.min_diff = lo;
  o.max_diff = hi;
  std::unique_ptr<RateLimiter> out;
  CHECK(RateLimiter::Make(o, &out).ok());
  return out;
}

TEST(BadOptionsFail) {
  RateLimiter::Options o;
  std::unique_ptr<RateLimiter> out;
  o.samples_per_insert = -1;
  CHECK(!RateLimiter::Make(o, &out).ok());
  o.samples_per_insert = 1;
  o.min_size_to_sample = 0;
  CHECK(!RateLimiter::Make(o, &out).ok());
  o.min_size_to_sample = 1;
  o.min_diff = 5;
  o.max_diff = 5;
  CHECK(!RateLimiter::Make(o, &out).ok());
}

TEST(MinSizeGatesSampling) {
  auto r = Make(2.0, 10, 20 - 8, 20 + 8);  // offset spi*min_size = 20, error_buffer 8
  CHECK(!r->CanSample(1));
  for (int i = 0; i < 10; ++i) {
    CHECK(r->CanInsert(1));
    r->Inserted(1);
  }
  CHECK(r->CanSample(1));
  bool granted = false;
  CHECK(r->AwaitSample(8, 0, &granted).ok() && granted);  // cursor 20 -> 12
  CHECK(!r->CanSample(1));                                // 11 < 12
  CHECK(r->CanInsert(1));                                 // 14 <= 28
  CHECK(r->AwaitSample(1, 0.0, &granted).ok() && !granted);  // no wait: refused
  CHECK(!r->AwaitSample(100, 0, &granted).ok());          // never fits the band
}

TEST(TwoThreadsStayInBand) {
  const double spi = 4, buf = 64;
  auto r = Make(spi, 100, spi * 100 - buf, spi * 100 + buf);
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread sampler([&] {
    for (int k = 0; k < 20000; ++k) {
      bool g = false;
      r->AwaitSample(8, 5.0, &g);
      if (!g) ++bad;
    }
    stop = true;
  });
  while (!stop) {
    if (!r->AwaitInsert(0.05)) continue;
    r->Inserted(1);
    const auto c = r->counters();
    const double d = c.inserts * spi - c.samples;
    if (c.inserts > 100 && (d < spi * 100 - buf - 8 || d > spi * 100 + buf + spi)) ++bad;
  }
  sampler.join();
  CHECK(bad == 0);
}

TEST(CancelWakesWaiters) {
  auto r = Make(1.0, 5, 5 - 2, 5 + 2);
  std::thread t([&] {
    bool g = true;
    r->AwaitSample(1, 1e9, &g);
    CHECK(!g);
  });
  r->Cancel();
  t.join();
  CHECK(!r->AwaitInsert(1e9));  // cancelled: fails at once
}

TEST_MAIN()
