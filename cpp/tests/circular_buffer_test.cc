// CircularBuffer: ring arithmetic, padding, validity and n-step sums on small capacities.
// (Bit-for-bit agreement with Dopamine is tested in tests/differential/.)
#include "core/circular_buffer.h"
#include "core/reserved.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "testing.h"
#include "tests/small_circular_buffer.h"

using namespace memoire;

namespace {

std::unique_ptr<CircularBuffer> Make(int64_t cap, int stack, int horizon, bool prioritized) {
  return memoire_test::MakeSmallCircularBuffer(cap, stack, horizon, prioritized, /*gamma=*/0.5);
}

void Add(CircularBuffer& b, uint8_t v, float r, bool terminal, double priority = 1.0) {
  uint8_t obs[2] = {v, static_cast<uint8_t>(v + 1)};
  int32_t a = v;
  uint8_t t = terminal;
  const void* rows[4] = {obs, &a, &r, &t};
  CHECK(b.Add(rows, terminal, priority).ok());
}

}  // namespace

TEST(TooSmallCapacityFails) {
  Schema schema;
  Schema::Make({{"observation", DType::kUInt8, {}}, {"action", DType::kInt32, {}},
                {"reward", DType::kFloat32, {}}, {"terminal", DType::kUInt8, {}}}, &schema);
  CircularBuffer::Options o;
  o.capacity = 4;
  o.stack_size = 3;
  o.update_horizon = 2;
  std::unique_ptr<CircularBuffer> b;
  CHECK(CircularBuffer::Make(schema, o, &b).code() == Code::kInvalidArgument);
}

TEST(PaddingCursorAndWrapAround) {
  auto b = Make(7, 3, 2, false);
  Add(*b, 10, 1.0f, false);  // two zero padding slots, then this one
  CHECK(b->add_count() == 3);
  for (int i = 0; i < 9; ++i) Add(*b, 20 + i, 1.0f, i == 4);
  // 1 episode start pad pair + 10 steps + pad pair after the terminal = 14 slots.
  CHECK(b->add_count() == 14);
  // Validity never accepts the slots around the cursor (cursor 0, horizon 2, stack 3).
  CHECK(!b->IsValid(5) && !b->IsValid(6) && !b->IsValid(0) && !b->IsValid(1) && !b->IsValid(2));
  CHECK(!b->IsValid(-1) && !b->IsValid(7));
}

TEST(NStepSumCutAtTerminal) {
  auto b = Make(11, 1, 3, false);
  Add(*b, 1, 1.0f, false);
  Add(*b, 2, 2.0f, true);   // terminal: the sum from slot 0 stops here
  Add(*b, 3, 4.0f, false);
  Add(*b, 4, 8.0f, false);
  Add(*b, 5, 16.0f, false);
  Add(*b, 6, 32.0f, false);
  int64_t idx[2] = {0, 2};
  uint8_t state[2 * 2], next_state[2 * 2], terminal[2];
  int32_t action[2], next_action[2], indices[2];
  float reward[2], next_reward[2];
  CircularBuffer::Outputs out;
  out.state = state;
  out.next_state = next_state;
  out.action = reinterpret_cast<uint8_t*>(action);
  out.next_action = reinterpret_cast<uint8_t*>(next_action);
  out.reward = reinterpret_cast<uint8_t*>(reward);
  out.next_reward = reinterpret_cast<uint8_t*>(next_reward);
  out.terminal = terminal;
  out.indices = indices;
  CHECK(b->Gather(idx, 2, out).ok());
  CHECK(reward[0] == 1.0f + 0.5f * 2.0f && terminal[0] == 1 && next_action[0] == 3);
  CHECK(reward[1] == 4.0f + 0.5f * 8.0f + 0.25f * 16.0f && terminal[1] == 0);
  CHECK(next_action[1] == 6 && next_state[2] == 6 && indices[1] == 2);
  int64_t unwritten[1] = {5};  // its next state is not written yet: Dopamine's assertion
  const memoire::Status not_added = b->Gather(unwritten, 1, out);
  CHECK(not_added.code() == Code::kNotFound && not_added.detail("key") == 5);
  int64_t past[1] = {b->capacity()};  // outside the ring: the index and the ring's size
  const memoire::Status outside = b->Gather(past, 1, out);
  CHECK(outside.code() == Code::kOutOfRange && outside.detail("index") == b->capacity() &&
        outside.detail("bound") == b->capacity());
}

TEST(PrioritiesCheckedBeforeAnyIsSet) {
  auto b = Make(9, 2, 1, true);
  for (int i = 0; i < 4; ++i) Add(*b, i, 0.0f, false, 2.0);
  int64_t idx[2] = {1, 9};
  double pri[2] = {5.0, 1.0};
  const memoire::Status bad = b->SetPriorities(idx, pri, 2);
  CHECK(bad.code() == Code::kOutOfRange && bad.detail("index") == 9 && bad.detail("bound") == 9);
  double got[1];
  int64_t one[1] = {1};
  CHECK(b->GetPriorities(one, 1, got).ok() && got[0] == 2.0);
  CHECK(b->max_recorded_priority() == 2.0);
  int64_t s[8];
  CHECK(b->SampleIndices(8, s).ok());
  for (int64_t i : s) CHECK(b->IsValid(i));
}

TEST(RestoreFromTakesStagingColumnsAndLeavesItZero) {
  auto b = Make(9, 2, 1, true);
  for (int i = 0; i < 4; ++i) Add(*b, 50 + i, 0.0f, false);
  auto staging = Make(9, 2, 1, true);
  uint8_t* obs = staging->column(CircularBuffer::kObservation);
  for (int i = 0; i < 18; ++i) obs[i] = static_cast<uint8_t>(i + 1);
  uint8_t* before = b->column(CircularBuffer::kObservation);
  std::vector<double> leaves(9, 1.5);
  CHECK(b->RestoreFrom(staging.get(), 7, {6}, leaves.data(), 1.5).ok());
  // Same addresses, the staged bytes; the staging buffer reads zeros.
  CHECK(b->column(CircularBuffer::kObservation) == before);
  for (int i = 0; i < 18; ++i) CHECK(before[i] == i + 1);
  for (int i = 0; i < 18; ++i) CHECK(obs[i] == 0);
  CHECK(b->add_count() == 7 && b->total_priority() == 9 * 1.5);
  // Another capacity is refused and changes nothing.
  auto other = Make(10, 2, 1, true);
  CHECK(b->RestoreFrom(other.get(), 3, {}, leaves.data(), 1.0).code() == Code::kInvalidArgument);
  CHECK(b->add_count() == 7 && before[0] == 1);
}

TEST(ReservedBytesMoveLargeBlocks) {
  // 16 MiB: the huge-page-aligned path.
  const size_t n = size_t{16} << 20;
  ReservedBytes a(n), b(n);
  CHECK(a.data() != nullptr && b.data() != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(a.data()) % (size_t{2} << 20) == 0);
  for (size_t i = 0; i < n; i += 4096) b.data()[i] = static_cast<uint8_t>(i >> 12);
  uint8_t* at = a.data();
  a.TakeContents(b);
  CHECK(a.data() == at);
  for (size_t i = 0; i < n; i += 4096) CHECK(a.data()[i] == static_cast<uint8_t>(i >> 12));
  for (size_t i = 0; i < n; i += 4096) CHECK(b.data()[i] == 0);
}

TEST_MAIN()
