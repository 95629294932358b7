// CacheRing: rows used once (oldest cache first, a permutation per cache), reuse draws, the
// eviction of the oldest cache, owners released when the last user lets go, timeouts, Close.
#include "core/cache_ring.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "tests/testing.h"

using namespace memoire;

namespace {

constexpr int64_t kRows = 8;

// A cache whose one int64 column holds base + row, kept alive by a shared vector.
std::shared_ptr<const CacheRing::Cache> MakeCache(int64_t base, int* alive) {
  auto data = std::shared_ptr<std::vector<int64_t>>(new std::vector<int64_t>(kRows),
                                                    [alive](std::vector<int64_t>* v) {
                                                      --*alive;
                                                      delete v;
                                                    });
  ++*alive;
  for (int64_t r = 0; r < kRows; ++r) (*data)[r] = base + r;
  auto c = std::make_shared<CacheRing::Cache>();
  c->columns = {reinterpret_cast<const uint8_t*>(data->data())};
  c->uuid = static_cast<uint64_t>(base);
  c->num_sampleable = base + 1;
  c->total_weight = 0.5 * base;
  c->owner = data;
  return c;
}

CacheRing Ring(int64_t n_caches) {
  return CacheRing({Field{"x", DType::kInt64, {}}}, kRows, n_caches, 7);
}

std::vector<int64_t> Batch(CacheRing& ring, int64_t n, bool reuse, Status* s,
                           std::vector<uint64_t>* uuid = nullptr) {
  std::vector<CacheRing::Part> parts;
  *s = ring.Take(n, reuse, 0.0, &parts);
  std::vector<int64_t> x(n, -1), ns(n);
  std::vector<uint64_t> u(n);
  std::vector<double> tw(n);
  if (!s->ok()) return x;
  uint8_t* cols[] = {reinterpret_cast<uint8_t*>(x.data())};
  ring.Gather(parts, cols, u.data(), ns.data(), tw.data());
  for (int64_t b = 0; b < n; ++b) {
    CHECK(ns[b] == static_cast<int64_t>(u[b]) + 1);  // each row carries its cache's values
    CHECK(tw[b] == 0.5 * static_cast<double>(u[b]));
  }
  if (uuid) *uuid = u;
  return x;
}

}  // namespace

TEST(RowsAreUsedOnceOldestCacheFirst) {
  int alive = 0;
  CacheRing ring = Ring(4);
  ring.Insert(MakeCache(100, &alive));
  ring.Insert(MakeCache(200, &alive));
  Status s;
  std::vector<uint64_t> uuid;
  std::vector<int64_t> first = Batch(ring, 12, false, &s, &uuid);
  CHECK(s.ok());
  std::vector<int64_t> a(first.begin(), first.begin() + 8), b(first.begin() + 8, first.end());
  std::sort(a.begin(), a.end());
  for (int64_t r = 0; r < kRows; ++r) CHECK(a[r] == 100 + r);  // all of the oldest cache
  for (int64_t v : b) CHECK(v >= 200 && v < 208);
  CHECK(uuid[0] == 100 && uuid[11] == 200);
  CHECK(ring.unused_rows() == 4);
  std::vector<int64_t> none = Batch(ring, 5, false, &s);
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK(s.message().find("4 unused row") != std::string::npos);
  CHECK(ring.unused_rows() == 4);  // a failed take changes nothing
  std::vector<int64_t> rest = Batch(ring, 4, false, &s);
  CHECK(s.ok());
  b.insert(b.end(), rest.begin(), rest.end());
  std::sort(b.begin(), b.end());
  for (int64_t r = 0; r < kRows; ++r) CHECK(b[r] == 200 + r);
}

TEST(ReuseDrawsFromEveryHeldCache) {
  int alive = 0;
  CacheRing ring = Ring(4);
  ring.Insert(MakeCache(100, &alive));
  ring.Insert(MakeCache(200, &alive));
  Status s;
  std::vector<int64_t> x = Batch(ring, 400, true, &s);
  CHECK(s.ok());
  int from_first = 0;
  for (int64_t v : x) {
    CHECK((v >= 100 && v < 108) || (v >= 200 && v < 208));
    from_first += v < 200;
  }
  CHECK(from_first > 120 && from_first < 280);
  CHECK(ring.unused_rows() == 16);  // reuse marks nothing used
}

TEST(OldestCacheIsEvictedAndReleased) {
  int alive = 0;
  {
    CacheRing ring = Ring(2);
    for (int64_t k = 1; k <= 5; ++k) ring.Insert(MakeCache(100 * k, &alive));
    CHECK(alive == 2 && ring.held() == 2);
    std::vector<CacheRing::Part> parts;
    CHECK(ring.Take(3, false, 0.0, &parts).ok());
    CHECK(parts.size() == 1 && parts[0].cache->uuid == 400);
    ring.Insert(MakeCache(600, &alive));
    ring.Insert(MakeCache(700, &alive));
    CHECK(alive == 3);  // 400 is evicted but the taken part still holds it
    parts.clear();
    CHECK(alive == 2);
  }
  CHECK(alive == 0);
}

TEST(TakeWaitsForACacheAndCloseWakesIt) {
  int alive = 0;
  CacheRing ring = Ring(2);
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ring.Insert(MakeCache(100, &alive));
  });
  std::vector<CacheRing::Part> parts;
  CHECK(ring.Take(8, false, 30.0, &parts).ok());
  producer.join();
  parts.clear();
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ring.Close();
  });
  Status s = ring.Take(1, false, 30.0, &parts);
  closer.join();
  CHECK(s.code() == Code::kFailedPrecondition && s.message().find("closed") != std::string::npos);
  CHECK(ring.Take(0, false, 0.0, &parts).code() == Code::kInvalidArgument);
}

TEST_MAIN()
