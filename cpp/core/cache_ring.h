// CacheRing: the caches a server holds in cache mode (the memoire API's design) and the batches drawn from them.
//
// An actor samples `cache_size` transitions from its own memory by priority and pushes them as
// one cache: per column (prev/next stacks of each field, weight, prob, done, id) `cache_size`
// rows, plus three values of its memory at that moment (uuid, num_sampleable, total_weight).
// The ring keeps the newest `n_caches` caches without copying them: a cache points into bytes
// its owner keeps alive (the received message), released when the last user lets go.
//
// Taking rows: without reuse every row is used once, oldest cache first, in a random order
// within each cache (drawn when the cache arrives: the actor's draw is stratified, so its rows
// come in memory order); with reuse, rows are drawn uniformly with replacement from all held
// caches. A batch gathers the taken rows of every column and repeats each row's cache values.
//
// Thread safety: all methods may be called concurrently. Take hands out shared references, so a
// cache evicted by Insert while a batch is being gathered stays alive until the gather ends.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/codec.h"
#include "core/rng.h"
#include "core/schema.h"
#include "core/status.h"

namespace memoire {

class CacheRing {
 public:
  struct Cache {
    std::vector<const uint8_t*> columns;  // per column: cache_size rows of the column's bytes
    uint64_t uuid = 0;
    int64_t num_sampleable = 0;
    double total_weight = 0;
    std::shared_ptr<const void> owner;  // keeps `columns` alive
  };

  // Rows [taken from one cache]: row numbers within it, in output order.
  struct Part {
    std::shared_ptr<const Cache> cache;
    std::vector<int64_t> rows;
  };

  // `columns`: the per-row layout of a cache (name, dtype and the shape after the cache axis).
  CacheRing(std::vector<Field> columns, int64_t cache_size, int64_t n_caches, uint64_t seed);

  const std::vector<Field>& columns() const { return columns_; }
  int64_t cache_size() const { return cache_size_; }
  int64_t n_caches() const { return n_caches_; }

  // Holds `cache`, evicting the oldest when n_caches are held, and wakes waiting takers.
  void Insert(std::shared_ptr<const Cache> cache);

  // Takes n >= 1 rows (see the header comment), waiting up to `timeout_s` seconds for enough
  // unused rows. kFailedPrecondition (changing nothing) when there are still too few, or at
  // once after Close(); the message says how many caches and unused rows there are.
  Status Take(int64_t n, bool reuse, double timeout_s, std::vector<Part>* parts);

  // Copies the rows of `parts` into outputs: one per column ([n, *shape] bytes), then uuid,
  // num_sampleable and total_weight per row. Runs without the ring's lock.
  void Gather(const std::vector<Part>& parts, uint8_t* const* column_out, uint64_t* uuid,
              int64_t* num_sampleable, double* total_weight) const;

  // Wakes every waiting Take, which then fails; later Takes fail at once.
  void Close();

  int64_t held() const;
  int64_t unused_rows() const;

 private:
  struct Slot {
    std::shared_ptr<const Cache> cache;
    std::vector<int64_t> order;  // a random permutation of the cache's rows
    int64_t used = 0;
    int64_t seq = 0;
  };
  Status TakeLocked(int64_t n, bool reuse, std::vector<Part>* parts);
  int64_t UnusedLocked() const;

  const std::vector<Field> columns_;
  const int64_t cache_size_;
  const int64_t n_caches_;
  mutable std::mutex mu_;
  std::condition_variable arrived_;
  std::vector<Slot> slots_;  // n_caches_ slots, empty where cache == nullptr
  int64_t inserted_ = 0;
  bool closed_ = false;
  Rng rng_;
};

// The entries of a CACHE message for a ring's layout: each column as [cache_size, *shape],
// then the 0-d cache values (protocol::kCacheScalars), nothing else.
std::vector<codec::ArraySpec> CacheMessageSpec(const std::vector<Field>& columns,
                                               int64_t cache_size);

// Checks a received CACHE message (frames[0] its header) against `spec` (CacheMessageSpec of
// `columns`) and `limits`, and fills *out: its columns point into the frames (the caller
// sets out->owner to what keeps them alive), its three values read. kDataLoss naming what was
// wrong; *out is then unspecified. Thread-safe (reads only its arguments).
Status DecodeCacheMessage(const codec::Frame* frames, size_t n_frames,
                          const codec::Limits& limits, const std::vector<Field>& columns,
                          const std::vector<codec::ArraySpec>& spec, CacheRing::Cache* out);

}  // namespace memoire
