#include "core/cache_ring.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/gather.h"
#include "core/protocol.h"

namespace memoire {

CacheRing::CacheRing(std::vector<Field> columns, int64_t cache_size, int64_t n_caches,
                     uint64_t seed)
    : columns_(std::move(columns)),
      cache_size_(cache_size),
      n_caches_(std::max<int64_t>(1, n_caches)),
      slots_(static_cast<size_t>(std::max<int64_t>(1, n_caches))),
      rng_(seed) {}

void CacheRing::Insert(std::shared_ptr<const Cache> cache) {
  std::vector<int64_t> order(static_cast<size_t>(cache_size_));
  std::shared_ptr<const Cache> evicted;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t i = 0; i < cache_size_; ++i) {  // Fisher-Yates, inside-out
      const int64_t j = static_cast<int64_t>(rng_.Below(static_cast<uint64_t>(i) + 1));
      order[i] = order[j];
      order[j] = i;
    }
    Slot& slot = slots_[static_cast<size_t>(inserted_ % n_caches_)];
    evicted = std::move(slot.cache);
    slot.cache = std::move(cache);
    slot.order = std::move(order);
    slot.used = 0;
    slot.seq = inserted_++;
  }
  arrived_.notify_all();
}

int64_t CacheRing::UnusedLocked() const {
  int64_t unused = 0;
  for (const Slot& s : slots_)
    if (s.cache) unused += cache_size_ - s.used;
  return unused;
}

Status CacheRing::TakeLocked(int64_t n, bool reuse, std::vector<Part>* parts) {
  parts->clear();
  std::vector<const Slot*> held;
  for (const Slot& s : slots_)
    if (s.cache) held.push_back(&s);
  if (held.empty() || cache_size_ == 0 || (!reuse && UnusedLocked() < n))
    return Error(Code::kFailedPrecondition, "need ", n, " rows, the server holds ", held.size(),
                 " cache(s) with ", UnusedLocked(), " unused row(s)");
  if (reuse) {  // uniform over every held row, with replacement; grouped by cache
    parts->resize(held.size());
    for (size_t k = 0; k < held.size(); ++k) parts->at(k).cache = held[k]->cache;
    for (int64_t b = 0; b < n; ++b) {
      const uint64_t r = rng_.Below(static_cast<uint64_t>(held.size() * cache_size_));
      parts->at(r / cache_size_).rows.push_back(static_cast<int64_t>(r % cache_size_));
    }
    parts->erase(std::remove_if(parts->begin(), parts->end(),
                                [](const Part& p) { return p.rows.empty(); }),
                 parts->end());
    return Status::OK();
  }
  std::vector<Slot*> order;
  for (Slot& s : slots_)
    if (s.cache && s.used < cache_size_) order.push_back(&s);
  std::sort(order.begin(), order.end(), [](const Slot* a, const Slot* b) { return a->seq < b->seq; });
  int64_t need = n;
  for (Slot* s : order) {
    const int64_t take = std::min(need, cache_size_ - s->used);
    parts->push_back({s->cache, std::vector<int64_t>(s->order.begin() + s->used,
                                                     s->order.begin() + s->used + take)});
    s->used += take;
    need -= take;
    if (need == 0) break;
  }
  return Status::OK();
}

Status CacheRing::Take(int64_t n, bool reuse, double timeout_s, std::vector<Part>* parts) {
  if (n < 1) return Error(Code::kInvalidArgument, "batch_size: expected >= 1, got ", n);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(std::max(0.0, timeout_s));
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    Status s = closed_ ? Error(Code::kFailedPrecondition, "the server is closed")
                       : TakeLocked(n, reuse, parts);
    if (s.ok() || closed_) return s;
    if (arrived_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return TakeLocked(n, reuse, parts);  // one last look, then its message
    }
  }
}

void CacheRing::Gather(const std::vector<Part>& parts, uint8_t* const* column_out,
                       uint64_t* uuid, int64_t* num_sampleable, double* total_weight) const {
  int64_t offset = 0;
  for (const Part& p : parts) {
    const int64_t n = static_cast<int64_t>(p.rows.size());
    for (size_t c = 0; c < columns_.size(); ++c) {
      const size_t rb = columns_[c].bytes();
      GatherRows(p.cache->columns[c], rb, p.rows.data(), n, column_out[c] + offset * rb);
    }
    std::fill(uuid + offset, uuid + offset + n, p.cache->uuid);
    std::fill(num_sampleable + offset, num_sampleable + offset + n, p.cache->num_sampleable);
    std::fill(total_weight + offset, total_weight + offset + n, p.cache->total_weight);
    offset += n;
  }
}

void CacheRing::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  arrived_.notify_all();
}

int64_t CacheRing::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t k = 0;
  for (const Slot& s : slots_) k += s.cache != nullptr;
  return k;
}

int64_t CacheRing::unused_rows() const {
  std::lock_guard<std::mutex> lock(mu_);
  return UnusedLocked();
}

std::vector<codec::ArraySpec> CacheMessageSpec(const std::vector<Field>& columns,
                                               int64_t cache_size) {
  std::vector<codec::ArraySpec> spec;
  for (const Field& f : columns) {
    std::vector<int64_t> shape{cache_size};
    shape.insert(shape.end(), f.shape.begin(), f.shape.end());
    spec.push_back({f.name, f.dtype, shape, false});
  }
  for (const protocol::Column& c : protocol::kCacheScalars)
    spec.push_back({c.name, c.dtype, {}, false});
  return spec;
}

Status DecodeCacheMessage(const codec::Frame* frames, size_t n_frames,
                          const codec::Limits& limits, const std::vector<Field>& columns,
                          const std::vector<codec::ArraySpec>& spec, CacheRing::Cache* out) {
  if (n_frames == 0) return Error(Code::kDataLoss, "empty message (no header frame)");
  std::vector<uint64_t> sizes;
  for (size_t i = 1; i < n_frames; ++i) sizes.push_back(frames[i].size);
  codec::Message msg;
  MEMOIRE_RETURN_IF_ERROR(codec::DecodeHeader(frames[0].data, frames[0].size, sizes.data(),
                                              sizes.size(), limits, &msg));
  if (msg.type != codec::MsgType::kCache)
    return Error(Code::kDataLoss, "expected a cache message, got ",
                 codec::MsgTypeName(static_cast<uint8_t>(msg.type)));
  int64_t batch = -1;
  MEMOIRE_RETURN_IF_ERROR(codec::CheckArrays(msg, spec, /*allow_extra=*/false, &batch));
  constexpr size_t kScalars = protocol::kNumCacheScalars;  // uuid, num_sampleable, total_weight
  static_assert(kScalars == 3, "the three cache values are read by type below");
  out->columns.assign(columns.size(), nullptr);
  const uint8_t* scalars[kScalars] = {nullptr, nullptr, nullptr};
  for (const codec::Entry& e : msg.entries) {  // the check proved every spec entry present
    if (e.depth != 0 || e.frame < 0) continue;
    const uint8_t* p = frames[1 + e.frame].data;
    for (size_t c = 0; c < columns.size(); ++c)
      if (e.name == columns[c].name) out->columns[c] = p;
    for (size_t k = 0; k < kScalars; ++k)
      if (e.name == protocol::kCacheScalars[k].name) scalars[k] = p;
  }
  std::memcpy(&out->uuid, scalars[0], 8);
  std::memcpy(&out->num_sampleable, scalars[1], 8);
  std::memcpy(&out->total_weight, scalars[2], 8);
  return Status::OK();
}

}  // namespace memoire
