// CircularBuffer::Restore (the TF face's checkpoint load): any add_count, episode ends, leaf
// priorities, max recorded priority and column bytes into fixtures.h's buffer (capacity 8,
// stack 2, horizon 2; uniform or prioritized by the first byte). Input after that byte:
//   u64 add_count, f64 max_recorded, u8 ends count (<= 16) and u64 each,
//   the capacity's leaves (f64 each, prioritized only), then each column's 8 rows
// A refused restore changes nothing; a restored buffer samples, gathers and adds.
#include <vector>

#include "core/circular_buffer.h"
#include "fuzz/fixtures.h"
#include "fuzz/fuzz_input.h"

using namespace memoire;

namespace {

struct Snapshot {
  int64_t add_count;
  std::vector<int64_t> ends;
  std::vector<std::vector<uint8_t>> columns;
  bool operator==(const Snapshot& o) const {
    return add_count == o.add_count && ends == o.ends && columns == o.columns;
  }
};

Snapshot Take(CircularBuffer& b) {
  Snapshot s{b.add_count(), b.EpisodeEnds(), {}};
  for (int f = 0; f < 4; ++f) {
    const size_t bytes = b.capacity() * b.schema().field(f).bytes();
    s.columns.emplace_back(b.column(f), b.column(f) + bytes);
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memoire_fuzz::Input in(data, size);
  const bool prioritized = in.U8() & 1;
  auto b = memoire_fuzz::MakeCircular(prioritized);
  const int64_t cap = b->capacity();
  const int64_t add_count = static_cast<int64_t>(in.U64());
  const double max_recorded = in.F64();
  std::vector<int64_t> ends(in.U8() % 17);
  for (int64_t& e : ends) e = static_cast<int64_t>(in.U64());
  std::vector<double> leaves(cap);
  if (prioritized)
    for (double& l : leaves) l = in.F64();
  std::vector<std::string> columns;
  std::vector<const void*> ptrs;
  for (int f = 0; f < 4; ++f) columns.push_back(in.Exactly(cap * b->schema().field(f).bytes()));
  for (const std::string& c : columns) ptrs.push_back(c.data());
  const Snapshot before = Take(*b);
  const Status s = b->Restore(ptrs.data(), add_count, ends, prioritized ? leaves.data() : nullptr,
                              max_recorded);
  if (!s.ok()) {
    FUZZ_ASSERT(Take(*b) == before);
    return 0;
  }
  FUZZ_ASSERT(b->add_count() == add_count);
  const int64_t n = 4;
  std::vector<uint8_t> state(n * 2 * 2), next(n * 2 * 2), terminal(n);
  std::vector<int32_t> action(n), next_action(n), indices(n);
  std::vector<float> reward(n), next_reward(n), prob(n);
  CircularBuffer::Outputs out;
  out.state = state.data();
  out.next_state = next.data();
  out.action = reinterpret_cast<uint8_t*>(action.data());
  out.next_action = reinterpret_cast<uint8_t*>(next_action.data());
  out.reward = reinterpret_cast<uint8_t*>(reward.data());
  out.next_reward = reinterpret_cast<uint8_t*>(next_reward.data());
  out.terminal = terminal.data();
  out.indices = indices.data();
  out.probabilities = prioritized ? prob.data() : nullptr;
  std::vector<int64_t> drawn(n);
  b->SampleAndGather(n, out, drawn.data());
  const int64_t probe[3] = {-1, 0, cap + 3};
  b->Gather(probe, 3, out);
  const uint8_t obs[2] = {1, 2};
  const int32_t act = 1;
  const float rew = 0.5f;
  const uint8_t term = 0;
  const void* row[4] = {obs, &act, &rew, &term};
  b->Add(row, false, 1.0);
  return 0;
}
