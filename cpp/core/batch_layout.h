// BatchLayout: the one description of a ReplayMemory batch as memoire hands it out (dtype,
// shape and bytes of each part, and where each part sits in a slot). It serves the prefetching
// feed's ring (bindings/feed.cc), the sampling stream's shared-memory slots
// (core/stream_batch.h) and the numpy views handed out of either (bindings/batch_views.h).
//
// Parts, in order: prev[7], next[7] (dtype_f[n, frame_stack, *shape_f]; a stack the cache
// flags leave out is `none`: no bytes, handed out as None), weight f32[n], prob f64[n],
// done bool[n], id int64[n], and with `totals` num_sampleable int64[1], total_weight f64[1]
// (a stream's batch: RemoteMemory.sample's counts).
//
// In a slot each part starts on a 64-byte boundary (offset); a slot's size (slot_bytes) is a
// whole number of pages, so slots laid end to end in a page-aligned mapping all start on a
// page (page-lockable one by one or together).
//
// Thread safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/replay_memory.h"
#include "core/schema.h"

namespace memoire {

struct BatchPart {
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  size_t bytes = 0;   // 0 when none
  size_t offset = 0;  // in a slot, 64-byte aligned
  bool none = false;
};

struct BatchLayout {
  static constexpr size_t kPartAlign = 64;
  static constexpr size_t kSlotAlign = 4096;
  static constexpr int kStacks = 2 * ReplayMemory::kNumFields;  // prev[7], next[7]
  std::vector<BatchPart> parts;
  size_t slot_bytes = 0;  // a multiple of kSlotAlign, >= kSlotAlign

  int64_t batch_size() const { return parts.size() > kStacks ? parts[kStacks].shape[0] : 0; }
  // Points `out`'s outputs at the parts at `data` (data[p] is part p; none parts skipped).
  void Point(uint8_t* const* data, ReplayMemory::SampleOut* out) const;
  // Points `data` (one pointer per part) at the parts of the slot at `base`; none parts null.
  void PartsAt(uint8_t* base, uint8_t** data) const;
};

// The layout of a batch of n from a memory of `schema` with `frame_stack` and `flags` (the 14
// cache flags, prev then next), with or without the stream's totals.
BatchLayout MemoryBatchLayout(const Schema& schema, int64_t n, int frame_stack,
                              const uint8_t* flags, bool totals);

}  // namespace memoire
