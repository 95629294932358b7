// CacheRing: rows used once (oldest cache first, a permutation per cache), reuse draws, the
// eviction of the oldest cache, owners released when the last user lets go, timeouts, Close;
// a CACHE message decoded against the ring's layout, and refused when it does not fit.
#include "core/cache_ring.h"

#include <algorithm>
#include <cstring>
#include <string>
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

// A CACHE message for Ring's layout: x int64[kRows], then the three cache values; `drop`
// leaves out the entry of that name, `type` replaces the message type.
struct CacheMessage {
  std::string header;
  std::vector<std::string> data;
  std::vector<codec::Frame> frames;
  CacheMessage(const std::string& drop = "", codec::MsgType type = codec::MsgType::kCache) {
    codec::Message m;
    m.type = type;
    auto add = [&](const char* name, DType dtype, std::vector<int64_t> shape, std::string bytes) {
      if (drop == name) return;
      codec::Entry e;
      e.name = name;
      e.kind = shape.empty() ? codec::Kind::kScalar : codec::Kind::kArray;
      e.dtype = dtype;
      e.shape = std::move(shape);
      m.entries.push_back(e);
      data.push_back(std::move(bytes));
    };
    std::vector<int64_t> x(kRows);
    for (int64_t r = 0; r < kRows; ++r) x[r] = 40 + r;
    const uint64_t uuid = 9;
    const int64_t num = 12;
    const double total = 2.5;
    add("x", DType::kInt64, {kRows}, std::string(reinterpret_cast<const char*>(x.data()), 8 * kRows));
    add("uuid", DType::kUInt64, {}, std::string(reinterpret_cast<const char*>(&uuid), 8));
    add("num_sampleable", DType::kInt64, {}, std::string(reinterpret_cast<const char*>(&num), 8));
    add("total_weight", DType::kFloat64, {}, std::string(reinterpret_cast<const char*>(&total), 8));
    CHECK(codec::Finalize(&m).ok());
    CHECK(codec::EncodeHeader(m, &header).ok());
    frames.push_back({reinterpret_cast<const uint8_t*>(header.data()), header.size()});
    for (const std::string& d : data)
      frames.push_back({reinterpret_cast<const uint8_t*>(d.data()), d.size()});
  }
};

TEST(CacheMessagesDecodeAgainstTheRingsLayout) {
  CacheRing ring = Ring(2);
  const auto spec = CacheMessageSpec(ring.columns(), ring.cache_size());
  CHECK(spec.size() == 4);
  codec::Limits limits;
  const CacheMessage good;
  CacheRing::Cache c;
  CHECK(DecodeCacheMessage(good.frames.data(), good.frames.size(), limits, ring.columns(), spec,
                           &c).ok());
  CHECK(c.uuid == 9 && c.num_sampleable == 12 && c.total_weight == 2.5);
  int64_t first;
  std::memcpy(&first, c.columns[0], 8);
  CHECK(c.columns.size() == 1 && first == 40);
  for (const char* drop : {"x", "uuid", "total_weight"}) {
    const CacheMessage bad(drop);
    CHECK(DecodeCacheMessage(bad.frames.data(), bad.frames.size(), limits, ring.columns(), spec,
                             &c).code() == Code::kDataLoss);
  }
  const CacheMessage chunk("", codec::MsgType::kChunk);
  CHECK(DecodeCacheMessage(chunk.frames.data(), chunk.frames.size(), limits, ring.columns(), spec,
                           &c).code() == Code::kDataLoss);
  CHECK(DecodeCacheMessage(good.frames.data(), 0, limits, ring.columns(), spec, &c).code() ==
        Code::kDataLoss);
  // A data frame shorter than its header says.
  CacheMessage short_frame;
  short_frame.frames[1].size -= 8;
  CHECK(DecodeCacheMessage(short_frame.frames.data(), short_frame.frames.size(), limits,
                           ring.columns(), spec, &c).code() == Code::kDataLoss);
}

TEST_MAIN()
