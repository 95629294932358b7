// Hostile state for the cores that load checkpoints: counters at and past their limits
// (set, restored, or reached by adds) are refused without changing anything, and a fuzz of
// Restore / Import with random, mostly invalid, inputs followed by adds, samples and gathers.
// Under scripts/sanitize.sh this runs with ASan and UBSan: an out-of-bounds access or a signed
// overflow anywhere on these paths fails it, whatever the checks below say.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "core/circular_buffer.h"
#include "core/transition_store.h"
#include "testing.h"
#include "tests/small_circular_buffer.h"

using namespace memoire;

namespace {

constexpr int64_t kCap = 8;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

std::unique_ptr<CircularBuffer> MakeBuffer(bool prioritized, int stack = 2) {
  return memoire_test::MakeSmallCircularBuffer(kCap, stack, 1, prioritized);
}

Status AddRow(CircularBuffer& b, uint8_t v, bool terminal) {
  uint8_t obs[2] = {v, v};
  int32_t a = v;
  float r = v;
  uint8_t t = terminal;
  const void* rows[4] = {obs, &a, &r, &t};
  return b.Add(rows, terminal, 1.0);
}

struct Batch {  // Gather's outputs for up to 4 transitions of MakeBuffer's schema
  uint8_t state[4 * 2 * 4], next_state[4 * 2 * 4], terminal[4];
  int32_t action[4], next_action[4], indices[4];
  float reward[4], next_reward[4], probabilities[4];
  CircularBuffer::Outputs out() {
    CircularBuffer::Outputs o;
    o.state = state;
    o.next_state = next_state;
    o.action = reinterpret_cast<uint8_t*>(action);
    o.next_action = reinterpret_cast<uint8_t*>(next_action);
    o.reward = reinterpret_cast<uint8_t*>(reward);
    o.next_reward = reinterpret_cast<uint8_t*>(next_reward);
    o.terminal = terminal;
    o.indices = indices;
    o.probabilities = probabilities;
    return o;
  }
};

std::unique_ptr<TransitionStore> MakeStore(bool prioritized, int stack = 2, int horizon = 1) {
  TransitionStore::Options o;
  o.max_capacity = kCap;
  o.stack_size = stack;
  o.update_horizon = horizon;
  o.prioritized = prioritized;
  o.tree_capacity = prioritized ? kCap : 0;
  o.frame_bytes = 3;
  o.elem_bytes = 1;
  o.action_bytes = 4;
  std::unique_ptr<TransitionStore> s;
  CHECK(TransitionStore::Make(o, &s).ok());
  return s;
}

Status Step(TransitionStore& s, uint8_t v, bool terminal, int64_t* emitted) {
  uint8_t frame[3] = {v, v, v};
  int32_t a = v;
  return s.Add(frame, reinterpret_cast<uint8_t*>(&a), v, terminal, terminal, 1.0, emitted);
}

}  // namespace

TEST(CircularAddCountSettersAreBounded) {
  for (bool prioritized : {false, true}) {
    auto b = MakeBuffer(prioritized);
    for (int i = 0; i < 5; ++i) CHECK(AddRow(*b, i, i == 3).ok());
    const int64_t count = b->add_count();
    for (int64_t bad : {int64_t{-1}, CircularBuffer::kMaxAddCount + 1, kInt64Max,
                        std::numeric_limits<int64_t>::min()}) {
      CHECK(b->set_add_count(bad).code() == Code::kInvalidArgument);
      CHECK(b->add_count() == count);
    }
    // At the limit: allowed, but no add passes it; nothing changes on the failed adds.
    CHECK(b->set_add_count(CircularBuffer::kMaxAddCount - 1).ok());
    CHECK(AddRow(*b, 9, false).code() == Code::kResourceExhausted);
    CHECK(b->add_count() == CircularBuffer::kMaxAddCount - 1);
    uint8_t obs[2] = {}, t = 0, ends[1] = {0};
    int32_t a = 0;
    float r = 0;
    double p = 1.0;
    const void* cols[4] = {obs, &a, &r, &t};
    CHECK(b->AddBatch(1, cols, ends, &p).code() == Code::kResourceExhausted);
    CHECK(b->AddBatch(kInt64Max, cols, ends, &p).code() == Code::kResourceExhausted);
    CHECK(b->add_count() == CircularBuffer::kMaxAddCount - 1);
    int64_t idx[4];
    CHECK(b->SampleIndices(4, idx).ok());  // sampling still works from that count
    for (int64_t i : idx) CHECK(i >= 0 && i < kCap);
    // Restore refuses the same counts.
    std::vector<uint8_t> o2(kCap * 2), t1(kCap);
    std::vector<int32_t> a1(kCap);
    std::vector<float> r1(kCap);
    std::vector<double> leaves(kCap, 1.0);
    const void* columns[4] = {o2.data(), a1.data(), r1.data(), t1.data()};
    CHECK(b->Restore(columns, kInt64Max, {}, leaves.data(), 1.0).code() == Code::kInvalidArgument);
    CHECK(b->Restore(columns, -5, {}, leaves.data(), 1.0).code() == Code::kInvalidArgument);
    CHECK(b->add_count() == CircularBuffer::kMaxAddCount - 1);
  }
}

TEST(TransitionStoreAddCountIsBounded) {
  for (bool prioritized : {false, true}) {
    auto s = MakeStore(prioritized);
    const int64_t limit = TransitionStore::kMaxAddCount;
    // Import refuses a count past the limit (or one that cannot hold its elements).
    CHECK(s->Import(limit + 1, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                    nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr).code() ==
          Code::kDataLoss);
    CHECK(s->Import(kInt64Max, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                    nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr).code() ==
          Code::kDataLoss);
    CHECK(s->add_count() == 0);
    // At the limit: imported, then every add fails and changes nothing.
    CHECK(s->Import(limit, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                    nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr).ok());
    int64_t emitted = -1;
    CHECK(Step(*s, 1, false, &emitted).code() == Code::kResourceExhausted);
    CHECK(s->add_count() == limit && s->size() == 0 && s->window_size() == 0);
    // Just below it: adds work until the next one could pass it.
    CHECK(s->Import(limit - 8, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                    nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr).ok());
    int ok_steps = 0;
    for (int i = 0; i < 20; ++i) {
      Status st = Step(*s, i, i % 4 == 3, &emitted);
      if (!st.ok()) {
        CHECK(st.code() == Code::kResourceExhausted);
        break;
      }
      ++ok_steps;
    }
    CHECK(ok_steps > 0 && s->add_count() <= limit);
  }
}

TEST(FuzzCircularRestoreThenUse) {
  std::mt19937_64 rng(1234);
  const double specials[] = {0.0, 1.0, -1.0, NAN, INFINITY, -INFINITY, 1e308, 5e-324};
  const int64_t counts[] = {0, 1, kCap - 1, kCap, kCap + 1, 1000,
                            CircularBuffer::kMaxAddCount - 1, CircularBuffer::kMaxAddCount,
                            CircularBuffer::kMaxAddCount + 1, kInt64Max, -1,
                            std::numeric_limits<int64_t>::min()};
  int restored = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const bool prioritized = iter % 2;
    auto b = MakeBuffer(prioritized, 1 + static_cast<int>(rng() % 3));
    for (int i = 0; i < 3; ++i) AddRow(*b, i, false);
    const int64_t before = b->add_count();
    std::vector<uint8_t> obs(kCap * 2), term(kCap);
    std::vector<int32_t> act(kCap);
    std::vector<float> rew(kCap);
    for (auto& x : obs) x = rng();
    for (auto& x : term) x = rng() % 3 == 0;
    for (auto& x : act) x = static_cast<int32_t>(rng());
    for (auto& x : rew) x = static_cast<float>(static_cast<int32_t>(rng() % 200) - 100);
    const int64_t count = rng() % 2 ? counts[rng() % 12] : static_cast<int64_t>(rng() % 64);
    std::vector<int64_t> ends;
    for (int i = static_cast<int>(rng() % 5); i > 0; --i)
      ends.push_back(rng() % 8 == 0 ? static_cast<int64_t>(rng()) : static_cast<int64_t>(rng() % kCap));
    std::vector<double> leaves(kCap);
    for (auto& x : leaves) x = rng() % 4 == 0 ? specials[rng() % 8] : (rng() % 1000) / 100.0;
    const void* columns[4] = {obs.data(), act.data(), rew.data(), term.data()};
    const Status st = b->Restore(columns, count, ends, leaves.data(), specials[rng() % 8]);
    if (!st.ok()) {
      CHECK(b->add_count() == before);
      continue;
    }
    CHECK(b->add_count() == count);
    ++restored;
    Batch batch;
    int64_t idx[4];
    if (b->SampleIndices(4, idx).ok()) {
      for (int64_t i : idx) CHECK(i >= 0 && i < kCap);
      b->Gather(idx, 4, batch.out());
    }
    int64_t any[4];
    for (auto& i : any) i = static_cast<int64_t>(rng() % (4 * kCap)) - 2 * kCap;
    if (iter % 7 == 0) any[rng() % 4] = rng() % 2 ? kInt64Max : std::numeric_limits<int64_t>::min();
    b->Gather(any, 4, batch.out());  // may refuse (Dopamine's asserts); must not misbehave
    for (int i = 0; i < 4; ++i) {
      const Status add = AddRow(*b, 50 + i, i == 2);
      CHECK(add.ok() || add.code() == Code::kResourceExhausted);
    }
    uint8_t valid[8];
    int64_t all[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    b->IsValidMany(all, 8, valid);
  }
  std::printf("  %d of 3000 restores accepted\n", restored);
  CHECK(restored > 300);  // the fuzz reaches the use of restored state, not only refusals
}

TEST(FuzzTransitionStoreImportThenUse) {
  std::mt19937_64 rng(99);
  const int64_t counts[] = {0, 1, 5, kCap, kCap + 3, TransitionStore::kMaxAddCount - 1,
                            TransitionStore::kMaxAddCount, TransitionStore::kMaxAddCount + 1,
                            kInt64Max, -1};
  int imported = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    const bool prioritized = iter % 2;
    const int stack = 1 + static_cast<int>(rng() % 3);
    const int horizon = 1 + static_cast<int>(rng() % 3);
    auto s = MakeStore(prioritized, stack, horizon);
    int64_t emitted = 0;
    for (int i = 0; i < 4; ++i) Step(*s, i, false, &emitted);
    const int64_t before = s->add_count(), before_size = s->size();
    const int64_t m = static_cast<int64_t>(rng() % (kCap + 3)) - 1;  // -1 .. kCap + 1
    const int64_t count = rng() % 2 ? counts[rng() % 10] : m + static_cast<int64_t>(rng() % 20);
    const int64_t n = m > 0 ? m : 0;
    std::vector<uint8_t> states(n * 3 * stack + 1), next_states(n * 3 * stack + 1);
    for (auto& x : states) x = rng() % 4;  // few values: frames repeat and get shared
    for (auto& x : next_states) x = rng() % 4;
    std::vector<uint8_t> actions(n * 4 + 1), terms(n + 1), ends(n + 1);
    std::vector<double> rewards(n + 1, 0.5);
    std::vector<int64_t> keys(n + 1);
    for (int64_t k = 0; k < n; ++k) keys[k] = count - n + k;
    std::shuffle(keys.begin(), keys.begin() + n, rng);
    if (n && rng() % 3 == 0) keys[rng() % n] = static_cast<int64_t>(rng());  // a bad key
    std::vector<double> nodes(prioritized ? s->num_nodes() : 1);
    for (auto& x : nodes) x = rng() % 6 == 0 ? -1.0 : (rng() % 100) / 10.0;
    const int64_t w = static_cast<int64_t>(rng() % (horizon + stack + 2));
    std::vector<uint8_t> wf(w * 3 + 1), wa(w * 4 + 1), wt(w + 1), we(w + 1);
    std::vector<double> wr(w + 1, 1.0);
    const Status st = s->Import(count, m, states.data(), actions.data(), rewards.data(),
                                next_states.data(), terms.data(), ends.data(), keys.data(),
                                prioritized ? nodes.data() : nullptr, w, wf.data(), wa.data(),
                                wr.data(), wt.data(), we.data());
    if (!st.ok()) {
      CHECK(s->add_count() == before && s->size() == before_size);
      continue;
    }
    CHECK(s->add_count() == count && s->size() == m);
    ++imported;
    std::vector<uint8_t> state(4 * 3 * stack), next_state(4 * 3 * stack), action(4 * 4);
    double reward[4];
    uint8_t terminal[4], episode_end[4];
    int64_t probe[4];
    for (auto& k : probe) k = count - static_cast<int64_t>(rng() % (kCap + 2));
    s->Gather(probe, 4, state.data(), action.data(), reward, next_state.data(), terminal,
              episode_end);
    if (m > 0) {
      int64_t dense[4];
      int32_t got[4];
      for (auto& d : dense) d = static_cast<int64_t>(rng() % m);
      CHECK(s->KeysAt(dense, 4, got).ok());
      double targets[4] = {0.0, 0.1, 0.5, 0.9}, probabilities[4];
      s->Query(targets, 4, got, probabilities);  // an inconsistent tree may refuse
    }
    for (int i = 0; i < 6; ++i) {
      const Status add = Step(*s, 10 + i, i == 4, &emitted);
      CHECK(add.ok() || add.code() == Code::kResourceExhausted);
    }
    CHECK(s->add_count() <= TransitionStore::kMaxAddCount);
  }
  std::printf("  %d of 2000 imports accepted\n", imported);
  CHECK(imported > 200);
}

TEST_MAIN()
