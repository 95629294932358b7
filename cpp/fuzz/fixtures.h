// The small stores and layouts the fuzz targets decode into, shared with the corpus generator
// (make_corpus.cc) so that its seeds match what each target expects. Small on purpose: a run
// is cheap, and capacities small enough that a few inputs wrap every ring.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/circular_buffer.h"
#include "core/episode_store.h"
#include "core/replay_memory.h"
#include "core/schema.h"
#include "core/stream_batch.h"
#include "core/transition_store.h"

namespace memoire_fuzz {

using memoire::DType;

// memoire's seven fields; the state s is uint8[8] so that it may be stored compressed.
inline memoire::Schema MemorySchema() {
  memoire::Schema schema;
  memoire::Schema::Make({{"s", DType::kUInt8, {8}},
                         {"a", DType::kFloat32, {}},
                         {"r", DType::kFloat32, {1}},
                         {"p", DType::kFloat32, {}},
                         {"v", DType::kFloat32, {1}},
                         {"q", DType::kFloat32, {1}},
                         {"i", DType::kInt32, {}}},
                        &schema);
  return schema;
}
constexpr int64_t kMemorySteps = 32;

inline std::shared_ptr<memoire::ReplayMemory> MakeMemory(bool compressed, int frame_stack = 1,
                                                         int multi_step = 1) {
  std::unique_ptr<memoire::ReplayMemory> m;
  memoire::ReplayMemory::Make(MemorySchema(), kMemorySteps, &m, false, compressed);
  m->Seed(7);
  memoire::ReplayMemory::Options o = m->options();
  o.frame_stack = frame_stack;
  o.multi_step = multi_step;
  m->SetOptions(o);
  return m;
}

// One episode of `len` entries into a memory (values derived from `start`).
inline void AddEpisode(memoire::ReplayMemory& m, int64_t start, int64_t len) {
  std::vector<uint8_t> s(len * 8);
  std::vector<float> a(len), w(len, 1.0f);
  std::vector<int32_t> info(len);
  for (int64_t k = 0; k < len; ++k) {
    std::memset(&s[k * 8], static_cast<int>((start + k) % 5), 6);
    a[k] = static_cast<float>(k % 3);
    w[k] = 0.5f + static_cast<float>(k % 2);
    info[k] = static_cast<int32_t>(start + k);
  }
  const void* fields[7] = {s.data(), a.data(), a.data(), a.data(), a.data(), nullptr,
                           info.data()};
  m.NewEpisode();
  m.AddEntries(len, fields, w.data());
  m.CloseEpisode(1.0f, true, true, len % 2 == 0);
}

// Dopamine's TF layout: observation uint8[2], action int32, reward float32, terminal uint8.
inline std::shared_ptr<memoire::CircularBuffer> MakeCircular(bool prioritized) {
  memoire::Schema schema;
  memoire::Schema::Make({{"observation", DType::kUInt8, {2}},
                         {"action", DType::kInt32, {}},
                         {"reward", DType::kFloat32, {}},
                         {"terminal", DType::kUInt8, {}}},
                        &schema);
  memoire::CircularBuffer::Options o;
  o.capacity = 8;
  o.stack_size = 2;
  o.update_horizon = 2;
  o.prioritized = prioritized;
  std::unique_ptr<memoire::CircularBuffer> b;
  memoire::CircularBuffer::Make(schema, o, &b);
  return b;
}

// The JAX face's store: observation uint8[3], action int32 (4 bytes), stack 2, horizon 2.
constexpr size_t kObsBytes = 3, kActionBytes = 4;
inline std::shared_ptr<memoire::TransitionStore> MakeTransitionStore(bool prioritized) {
  memoire::TransitionStore::Options o;
  o.max_capacity = 8;
  o.stack_size = 2;
  o.update_horizon = 2;
  o.gamma = 0.9;
  o.prioritized = prioritized;
  o.tree_capacity = 8;
  o.frame_bytes = kObsBytes;
  o.elem_bytes = 1;
  o.action_bytes = kActionBytes;
  std::unique_ptr<memoire::TransitionStore> t;
  memoire::TransitionStore::Make(o, &t);
  return t;
}

// The stores a chunk ingest commits into, by number (the chunk_ingest target's first byte).
constexpr int kNumStoreKinds = 6;
inline const char* StoreKindName(int kind) {
  static const char* names[kNumStoreKinds] = {"memory",   "memory_compressed",
                                              "circular", "circular_prioritized",
                                              "jax",      "jax_prioritized"};
  return names[kind];
}
inline std::shared_ptr<memoire::EpisodeStore> MakeEpisodeStore(int kind) {
  switch (kind) {
    case 0:
    case 1:
      return memoire::EpisodeStoreOf(MakeMemory(kind == 1, 2, 2));
    case 2:
    case 3:
      return memoire::EpisodeStoreOf(MakeCircular(kind == 3), /*allow_nonfinite=*/kind == 3);
    default: {
      std::unique_ptr<memoire::TransitionEpisodeStore> s;
      memoire::TransitionEpisodeStore::Make(MakeTransitionStore(kind == 5), DType::kUInt8, {3},
                                            DType::kInt32, {}, false, &s);
      return s;
    }
  }
}

// The sampling stream's layout from four bytes (the stream_batch target's prefix): batch size,
// frame stack and multi-step 1..4, the 14 stack flags, whether states travel compressed.
inline memoire::StreamLayout StreamLayoutOf(uint8_t sizes, uint16_t flags, uint8_t compressed) {
  memoire::StreamLayout layout;
  layout.schema = MemorySchema();
  layout.batch_size = 1 + (sizes & 3);
  layout.frame_stack = 1 + ((sizes >> 2) & 3);
  layout.multi_step = 1 + ((sizes >> 4) & 3);
  for (int k = 0; k < 14; ++k) layout.flags[k] = (flags >> k) & 1;
  layout.compressed_state = compressed & 1;
  return layout;
}

// A cache ring's layout (the cache_ring target): a stack column, weights and ids, 4 rows.
constexpr int64_t kCacheSize = 4;
inline std::vector<memoire::Field> CacheColumns() {
  return {{"prev_s", DType::kUInt8, {2, 8}}, {"weight", DType::kFloat32, {}},
          {"id", DType::kInt64, {}}};
}

}  // namespace memoire_fuzz
