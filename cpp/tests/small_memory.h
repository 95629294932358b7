// The small memory the core's tests share: s int64 (a position), a and p float32 scalars,
// r, v and q float32[1], i int32, so that every stored value can be derived and checked.
#pragma once

#include <memory>

#include "core/replay_memory.h"
#include "tests/testing.h"

namespace memoire_test {

inline std::unique_ptr<memoire::ReplayMemory> MakeSmallMemory(int64_t max_step, uint64_t seed) {
  using memoire::DType;
  memoire::Schema schema;
  CHECK(memoire::Schema::Make({{"s", DType::kInt64, {}},
                               {"a", DType::kFloat32, {}},
                               {"r", DType::kFloat32, {1}},
                               {"p", DType::kFloat32, {}},
                               {"v", DType::kFloat32, {1}},
                               {"q", DType::kFloat32, {1}},
                               {"i", DType::kInt32, {}}},
                              &schema).ok());
  std::unique_ptr<memoire::ReplayMemory> m;
  CHECK(memoire::ReplayMemory::Make(schema, max_step, &m).ok());
  m->Seed(seed);
  return m;
}

}  // namespace memoire_test
