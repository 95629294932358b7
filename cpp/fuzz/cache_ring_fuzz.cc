// The cache ring's Insert (a server in cache mode): CACHE messages checked by
// DecodeCacheMessage against a ring of fixtures' cache layout (CacheLayout: 3 columns, caches
// of 4 rows, 3 held) and held without a copy, then batches taken and gathered. The input is
// operations: op % 2 == 0 a message (fuzz_input.h), else a take of 1 + (op >> 1) % 8 rows
// (with reuse when op & 0x80) gathered at once. A gathered row is one of a held cache's; the
// messages stay alive only as long as their caches are referenced (AddressSanitizer).
#include <memory>
#include <vector>

#include "core/cache_ring.h"
#include "fuzz/fixtures.h"
#include "fuzz/fuzz_input.h"

using namespace memoire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memoire_fuzz::Input in(data, size);
  const std::vector<Field> columns = memoire_fuzz::CacheColumns();
  const int64_t cache_size = memoire_fuzz::kCacheSize;
  CacheRing ring(columns, cache_size, 3, 5);
  const std::vector<codec::ArraySpec> spec = CacheMessageSpec(columns, cache_size);
  codec::Limits limits;
  limits.max_payload_bytes = 1 << 16;
  for (int ops = 0; !in.empty() && ops < 128; ++ops) {
    const uint8_t op = in.U8();
    if (op % 2 == 0) {
      // The message's bytes are the cache's owner: freed when its last user lets go.
      auto msg = std::make_shared<memoire_fuzz::Message>(memoire_fuzz::ReadMessage(in));
      const std::vector<codec::Frame> frames = msg->view();
      auto cache = std::make_shared<CacheRing::Cache>();
      const Status s = DecodeCacheMessage(frames.data(), frames.size(), limits, columns, spec,
                                          cache.get());
      if (!s.ok()) {
        FUZZ_ASSERT(s.code() == Code::kDataLoss);
        continue;
      }
      for (const uint8_t* c : cache->columns) FUZZ_ASSERT(c != nullptr);
      cache->owner = msg;
      ring.Insert(std::move(cache));
      continue;
    }
    const int64_t n = 1 + (op >> 1) % 8;
    std::vector<CacheRing::Part> parts;
    if (!ring.Take(n, op & 0x80, 0.0, &parts).ok()) continue;
    std::vector<std::vector<uint8_t>> out;
    std::vector<uint8_t*> ptrs;
    for (const Field& f : columns) out.emplace_back(n * f.bytes());
    for (auto& o : out) ptrs.push_back(o.data());
    std::vector<uint64_t> uuid(n);
    std::vector<int64_t> num(n);
    std::vector<double> total(n);
    ring.Gather(parts, ptrs.data(), uuid.data(), num.data(), total.data());
    int64_t rows = 0;
    for (const CacheRing::Part& p : parts) {
      for (int64_t r : p.rows) FUZZ_ASSERT(r >= 0 && r < cache_size);
      rows += static_cast<int64_t>(p.rows.size());
    }
    FUZZ_ASSERT(rows == n);
  }
  ring.Close();
  return 0;
}
