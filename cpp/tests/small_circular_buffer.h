// The small Dopamine-style buffer the core's tests share: observation uint8[2], action int32,
// reward float32, terminal uint8.
#pragma once

#include <memory>

#include "core/circular_buffer.h"
#include "tests/testing.h"

namespace memoire_test {

inline std::unique_ptr<memoire::CircularBuffer> MakeSmallCircularBuffer(
    int64_t capacity, int stack, int horizon, bool prioritized,
    double gamma = memoire::CircularBuffer::Options().gamma) {
  using memoire::DType;
  memoire::Schema schema;
  CHECK(memoire::Schema::Make({{"observation", DType::kUInt8, {2}},
                               {"action", DType::kInt32, {}},
                               {"reward", DType::kFloat32, {}},
                               {"terminal", DType::kUInt8, {}}},
                              &schema).ok());
  memoire::CircularBuffer::Options o;
  o.capacity = capacity;
  o.stack_size = stack;
  o.update_horizon = horizon;
  o.gamma = gamma;
  o.prioritized = prioritized;
  std::unique_ptr<memoire::CircularBuffer> b;
  CHECK(memoire::CircularBuffer::Make(schema, o, &b).ok());
  return b;
}

}  // namespace memoire_test
