// TransitionStore::Import (the JAX face's checkpoint load, whose arrays Python only sizes):
// any add_count, keys, tree nodes, elements and accumulator window into fixtures.h's store
// (capacity 8, stack 2, horizon 2; uniform or prioritized by the first byte). Input after it:
//   u64 add_count, u8 m (elements, % 10: up to capacity + 1), u8 w (window steps, % 6),
//   m keys (u64 each), the tree's nodes (f64 each, prioritized only), then the elements'
//   columns and the window's, zero-padded
// A refused import changes nothing; an imported store gathers every key, samples and adds.
#include <vector>

#include "core/rng.h"
#include "core/transition_store.h"
#include "fuzz/fixtures.h"
#include "fuzz/fuzz_input.h"

using namespace memoire;
using memoire_fuzz::kActionBytes;
using memoire_fuzz::kObsBytes;

namespace {

std::vector<int64_t> Keys(const TransitionStore& t) {
  std::vector<int64_t> keys(t.size());
  std::vector<double> nodes(t.num_nodes());
  t.ExportSampler(keys.data(), nodes.data());
  return keys;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memoire_fuzz::Input in(data, size);
  const bool prioritized = in.U8() & 1;
  auto t = memoire_fuzz::MakeTransitionStore(prioritized);
  const int s = t->options().stack_size;
  // Something stored before, to see that a refused import keeps it.
  for (int k = 0; k < 5; ++k) {
    const uint8_t frame[kObsBytes] = {uint8_t(k), 1, 2};
    const uint8_t action[kActionBytes] = {uint8_t(k), 0, 0, 0};
    int64_t emitted;
    t->Add(frame, action, 0.5, false, false, 1.0, &emitted);
  }
  const int64_t add_count = static_cast<int64_t>(in.U64());
  const int64_t m = in.U8() % 10;
  const int64_t w = in.U8() % 6;
  std::vector<int64_t> keys(m);
  for (int64_t& k : keys) k = static_cast<int64_t>(in.U64());
  std::vector<double> nodes(t->num_nodes());
  for (double& x : nodes) x = in.F64();
  const std::string states = in.Exactly(m * kObsBytes * s);
  const std::string next_states = in.Exactly(m * kObsBytes * s);
  const std::string actions = in.Exactly(m * kActionBytes);
  const std::string terminals = in.Exactly(m), episode_ends = in.Exactly(m);
  std::vector<double> rewards(m);
  for (double& r : rewards) r = in.F64();
  const std::string win_frames = in.Exactly(w * kObsBytes);
  const std::string win_actions = in.Exactly(w * kActionBytes);
  const std::string win_terminals = in.Exactly(w), win_episode_ends = in.Exactly(w);
  std::vector<double> win_rewards(w);
  for (double& r : win_rewards) r = in.F64();
  auto u8 = [](const std::string& x) { return reinterpret_cast<const uint8_t*>(x.data()); };

  const int64_t count_before = t->add_count();
  const std::vector<int64_t> keys_before = Keys(*t);
  const int64_t window_before = t->window_size();
  const Status st = t->Import(add_count, m, u8(states), u8(actions), rewards.data(),
                              u8(next_states), u8(terminals), u8(episode_ends), keys.data(),
                              prioritized ? nodes.data() : nullptr, w, u8(win_frames),
                              u8(win_actions), win_rewards.data(), u8(win_terminals),
                              u8(win_episode_ends));
  if (!st.ok()) {
    FUZZ_ASSERT(st.code() == Code::kDataLoss);
    FUZZ_ASSERT(t->add_count() == count_before && Keys(*t) == keys_before &&
                t->window_size() == window_before);
    return 0;
  }
  FUZZ_ASSERT(t->add_count() == add_count && t->size() == m && t->window_size() == w);
  // Every stored key gathers to what was imported.
  std::vector<int64_t> stored = Keys(*t);
  std::vector<uint8_t> state(m * kObsBytes * s), next(m * kObsBytes * s), action(m * kActionBytes),
      term(m), end(m);
  std::vector<double> reward(m);
  std::vector<int64_t> in_order(m);
  for (int64_t k = 0; k < m; ++k) in_order[k] = add_count - m + k;
  FUZZ_ASSERT(t->Gather(in_order.data(), m, state.data(), action.data(), reward.data(),
                        next.data(), term.data(), end.data()).ok());
  FUZZ_ASSERT(std::equal(state.begin(), state.end(), u8(states)));
  FUZZ_ASSERT(std::equal(next.begin(), next.end(), u8(next_states)));
  if (m > 0) {
    Rng rng(3);
    std::vector<int32_t> drawn(4);
    std::vector<double> prob(4), r4(4);
    std::vector<uint8_t> s4(4 * kObsBytes * s), n4(4 * kObsBytes * s), a4(4 * kActionBytes),
        t4(4), e4(4);
    const Status sampled = t->SampleGather(&rng, 4, drawn.data(), prob.data(), s4.data(),
                                           a4.data(), r4.data(), n4.data(), t4.data(), e4.data());
    FUZZ_ASSERT(sampled.ok() || sampled.code() == Code::kOutOfRange);
  }
  const uint8_t frame[kObsBytes] = {9, 9, 9};
  const uint8_t action1[kActionBytes] = {};
  int64_t emitted;
  for (int k = 0; k < 4; ++k) t->Add(frame, action1, 1.0, k == 3, false, 1.0, &emitted);
  return 0;
}
