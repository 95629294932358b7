// TransitionStore (the JAX face's store): the elements Dopamine's accumulator yields (stacks
// with zero frames at an episode's start, n-step rewards cut at a terminal), keys and eviction
// by count, priorities, the feed's draws against Gather, AddBatch as Adds, and checkpoints:
// Export then Import gives the same store, and a crafted checkpoint is refused (kDataLoss)
// with the store unchanged, keys anywhere in int64 included.
#include "core/transition_store.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "tests/testing.h"

using namespace memoire;

namespace {

constexpr size_t kFrame = 3;  // observation uint8[3]: every byte of step k's frame is k + 1

std::unique_ptr<TransitionStore> MakeStore(int64_t capacity, int stack, int horizon,
                                           bool prioritized = false) {
  TransitionStore::Options o;
  o.max_capacity = capacity;
  o.stack_size = stack;
  o.update_horizon = horizon;
  o.gamma = 0.5;
  o.prioritized = prioritized;
  o.tree_capacity = capacity;
  o.frame_bytes = kFrame;
  o.elem_bytes = 1;
  o.action_bytes = 1;
  std::unique_ptr<TransitionStore> t;
  CHECK(TransitionStore::Make(o, &t).ok());
  return t;
}

// Step k: frame k + 1 (0 is the zero frame's byte), action k % 4, reward k.
int64_t AddStep(TransitionStore& t, int64_t k, bool terminal, bool episode_end = false,
                double priority = 1.0) {
  std::vector<uint8_t> frame(kFrame, static_cast<uint8_t>(k + 1));
  const uint8_t action = static_cast<uint8_t>(k % 4);
  int64_t emitted = -1;
  CHECK(t.Add(frame.data(), &action, static_cast<double>(k), terminal, episode_end, priority,
              &emitted).ok());
  return emitted;
}

// One gathered element: its stacks (frame values per stack position, read from element 0 of
// the channel-last layout after checking the frame's bytes agree) and small fields.
struct Element {
  std::vector<int> state, next;
  int action = -1;
  double reward = 0;
  bool terminal = false, episode_end = false;
};

std::vector<int> Stack(const uint8_t* at, int stack) {
  std::vector<int> v(stack);
  for (int k = 0; k < stack; ++k) {
    v[k] = at[k];
    for (size_t e = 1; e < kFrame; ++e) CHECK(at[e * stack + k] == at[k]);
  }
  return v;
}

std::vector<Element> GatherKeys(const TransitionStore& t, const std::vector<int64_t>& keys) {
  const int s = t.options().stack_size;
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<uint8_t> state(n * kFrame * s), next(n * kFrame * s), action(n), term(n), end(n);
  std::vector<double> reward(n);
  CHECK(t.Gather(keys.data(), n, state.data(), action.data(), reward.data(), next.data(),
                 term.data(), end.data()).ok());
  std::vector<Element> out(n);
  for (int64_t b = 0; b < n; ++b) {
    out[b].state = Stack(&state[b * kFrame * s], s);
    out[b].next = Stack(&next[b * kFrame * s], s);
    out[b].action = action[b];
    out[b].reward = reward[b];
    out[b].terminal = term[b] != 0;
    out[b].episode_end = end[b] != 0;
  }
  return out;
}

std::vector<int64_t> StoredKeys(const TransitionStore& t) {
  std::vector<int64_t> keys(t.size());
  std::vector<double> nodes(t.num_nodes());
  t.ExportSampler(keys.data(), nodes.data());
  return keys;
}

bool SameElements(const std::vector<Element>& a, const std::vector<Element>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].state != b[i].state || a[i].next != b[i].next || a[i].action != b[i].action ||
        a[i].reward != b[i].reward || a[i].terminal != b[i].terminal ||
        a[i].episode_end != b[i].episode_end)
      return false;
  return true;
}

// Everything a checkpoint holds, exported, with the arguments Import takes.
struct Exported {
  int64_t add_count = 0, m = 0, w = 0;
  std::vector<uint8_t> states, actions, next_states, terminals, episode_ends;
  std::vector<double> rewards, nodes;
  std::vector<int64_t> keys;
  std::vector<uint8_t> win_frames, win_actions, win_terminals, win_episode_ends;
  std::vector<double> win_rewards;

  explicit Exported(const TransitionStore& t) {
    const int s = t.options().stack_size;
    add_count = t.add_count();
    m = t.size();
    keys.resize(m);
    nodes.resize(t.num_nodes());
    t.ExportSampler(keys.data(), nodes.data());
    // Elements in key order: Import stores keys [add_count - m, add_count).
    std::vector<int64_t> in_order(m);
    for (int64_t k = 0; k < m; ++k) in_order[k] = add_count - m + k;
    states.resize(m * kFrame * s);
    next_states.resize(m * kFrame * s);
    actions.resize(m);
    terminals.resize(m);
    episode_ends.resize(m);
    rewards.resize(m);
    CHECK(t.Gather(in_order.data(), m, states.data(), actions.data(), rewards.data(),
                   next_states.data(), terminals.data(), episode_ends.data()).ok());
    w = t.window_size();
    win_frames.resize(w * kFrame);
    win_actions.resize(w);
    win_rewards.resize(w);
    win_terminals.resize(w);
    win_episode_ends.resize(w);
    t.ExportWindow(win_frames.data(), win_actions.data(), win_rewards.data(),
                   win_terminals.data(), win_episode_ends.data());
  }
  Status ImportInto(TransitionStore& t) const {
    return t.Import(add_count, m, states.data(), actions.data(), rewards.data(),
                    next_states.data(), terminals.data(), episode_ends.data(), keys.data(),
                    t.options().prioritized ? nodes.data() : nullptr, w, win_frames.data(),
                    win_actions.data(), win_rewards.data(), win_terminals.data(),
                    win_episode_ends.data());
  }
};

}  // namespace

TEST(MakeRefusesSettingsOutOfRange) {
  TransitionStore::Options o;
  o.max_capacity = 4;
  o.frame_bytes = 3;
  std::unique_ptr<TransitionStore> t;
  CHECK(TransitionStore::Make(o, &t).ok());
  for (auto change : {+[](TransitionStore::Options& x) { x.max_capacity = 0; },
                      +[](TransitionStore::Options& x) { x.stack_size = 0; },
                      +[](TransitionStore::Options& x) { x.stack_size = 65; },
                      +[](TransitionStore::Options& x) { x.update_horizon = 0; },
                      +[](TransitionStore::Options& x) { x.frame_bytes = 0; },
                      +[](TransitionStore::Options& x) { x.elem_bytes = 2; },  // 3 % 2 != 0
                      +[](TransitionStore::Options& x) {
                        x.prioritized = true;
                        x.tree_capacity = 0;
                      }}) {
    TransitionStore::Options bad = o;
    change(bad);
    std::unique_ptr<TransitionStore> u;
    CHECK(TransitionStore::Make(bad, &u).code() == Code::kInvalidArgument);
    CHECK(u == nullptr);
  }
}

TEST(OneStepElementsAreConsecutiveStepsKeyedByCount) {
  auto t = MakeStore(16, 1, 1);
  CHECK(AddStep(*t, 0, false) == 0);  // the first step yields nothing yet
  CHECK(AddStep(*t, 1, false) == 1);
  CHECK(AddStep(*t, 2, false) == 1);
  CHECK(AddStep(*t, 3, true) == 1);
  CHECK(t->add_count() == 3 && t->size() == 3);
  const auto e = GatherKeys(*t, {0, 1, 2});
  for (int k = 0; k < 3; ++k) {
    CHECK(e[k].state == std::vector<int>{k + 1});
    CHECK(e[k].next == std::vector<int>{k + 2});
    CHECK(e[k].action == k % 4);
    CHECK(e[k].reward == k);
    CHECK(e[k].terminal == (k == 2));
    CHECK(e[k].episode_end == (k == 2));  // Dopamine sets episode_end from is_terminal
  }
  // A key never stored is kNotFound and writes nothing.
  std::vector<int64_t> missing = {1, 3};
  uint8_t buf[2 * kFrame] = {}, small[2] = {};
  double reward[2] = {};
  CHECK(t->Gather(missing.data(), 2, buf, small, reward, buf, small, small).code() ==
        Code::kNotFound);
}

TEST(StacksStartWithZeroFramesAndNStepRewardsStopAtTheTerminal) {
  auto t = MakeStore(16, 2, 2);  // stack 2, horizon 2, gamma 0.5
  CHECK(AddStep(*t, 0, false) == 0);
  CHECK(AddStep(*t, 1, false) == 0);
  CHECK(AddStep(*t, 2, false) == 1);  // state ends at step 0, next at step 2
  auto e = GatherKeys(*t, {0});
  CHECK(e[0].state == (std::vector<int>{0, 1}));  // the zero frame before the episode
  CHECK(e[0].next == (std::vector<int>{2, 3}));
  CHECK(e[0].reward == 0.0 + 0.5 * 1.0);
  CHECK(e[0].action == 0);
  // The terminal at step 3 yields the remaining elements of the window (Dopamine's loop).
  const int64_t before = t->add_count();
  const int64_t yielded = AddStep(*t, 3, true);
  CHECK(yielded >= 1);
  CHECK(t->add_count() == before + yielded);
  std::vector<int64_t> keys;
  for (int64_t k = before; k < t->add_count(); ++k) keys.push_back(k);
  e = GatherKeys(*t, keys);
  CHECK(e[0].state == (std::vector<int>{1, 2}));  // step 1: reward 1 + 0.5 * 2 (horizon 2)
  CHECK(e[0].next == (std::vector<int>{3, 4}));
  CHECK(e[0].reward == 1.0 + 0.5 * 2.0);
  for (const Element& x : e) CHECK(x.terminal);
  // After the terminal a new episode starts with zero frames again.
  AddStep(*t, 10, false);
  AddStep(*t, 11, false);
  CHECK(AddStep(*t, 12, false) == 1);
  e = GatherKeys(*t, {t->add_count() - 1});
  CHECK(e[0].state == (std::vector<int>{0, 11}));
}

TEST(EvictionDropsTheOldestKeysByCount) {
  auto t = MakeStore(5, 1, 1);
  for (int64_t k = 0; k < 12; ++k) AddStep(*t, k, false);
  CHECK(t->add_count() == 11);
  CHECK(t->size() == 5);
  auto keys = StoredKeys(*t);
  std::vector<uint8_t> seen(11, 0);
  for (int64_t key : keys) {
    CHECK(key >= 6 && key < 11);
    if (key >= 0 && key < 11) seen[key]++;
  }
  for (int64_t k = 6; k < 11; ++k) CHECK(seen[k] == 1);
  const auto e = GatherKeys(*t, {6, 10});
  CHECK(e[0].state == std::vector<int>{7} && e[1].next == std::vector<int>{12});
  std::vector<double> out(1);
  const int64_t evicted = 5;
  CHECK(t->Priorities(&evicted, 1, out.data()).code() == Code::kNotFound);
  // The dense index map: every index names a stored key.
  std::vector<int64_t> idx = {0, 4};
  int32_t got[2];
  CHECK(t->KeysAt(idx.data(), 2, got).ok());
  CHECK(got[0] >= 6 && got[1] >= 6);
  idx[1] = 5;
  CHECK(t->KeysAt(idx.data(), 2, got).code() == Code::kOutOfRange);
}

TEST(PrioritiesUpdateQueryAndRefuseBadValues) {
  auto t = MakeStore(8, 1, 1, /*prioritized=*/true);
  for (int64_t k = 0; k < 5; ++k) AddStep(*t, k, false, false, 1.0);
  CHECK(t->size() == 4);
  CHECK(std::fabs(t->tree_root() - 4.0) < 1e-12);
  std::vector<int64_t> keys = {0, 1, 2, 3};
  std::vector<double> values = {0.0, 3.0, 0.0, 1.0};
  CHECK(t->Update(keys.data(), values.data(), 4).ok());
  CHECK(std::fabs(t->tree_root() - 4.0) < 1e-12);
  std::vector<double> got(4);
  CHECK(t->Priorities(keys.data(), 4, got.data()).ok());
  CHECK(got == values);
  // Targets below 3 land on key 1, the rest on key 3.
  const double targets[2] = {2.5, 3.5};
  int32_t drawn[2];
  double prob[2];
  CHECK(t->Query(targets, 2, drawn, prob).ok());
  CHECK(drawn[0] == 1 && drawn[1] == 3);
  CHECK(std::fabs(prob[0] - 0.75) < 1e-12 && std::fabs(prob[1] - 0.25) < 1e-12);
  const double outside[1] = {4.0};
  CHECK(t->Query(outside, 1, drawn, prob).code() == Code::kInvalidArgument);
  // A NaN or negative value, or a key not stored: refused, nothing set.
  for (double bad : {-1.0, std::numeric_limits<double>::quiet_NaN()}) {
    std::vector<double> vv = {5.0, bad};
    CHECK(t->Update(keys.data(), vv.data(), 2).code() == Code::kInvalidArgument);
  }
  std::vector<int64_t> gone = {1, 9};
  std::vector<double> vv = {5.0, 5.0};
  CHECK(t->Update(gone.data(), vv.data(), 2).code() == Code::kNotFound);
  CHECK(t->Priorities(keys.data(), 4, got.data()).ok());
  CHECK(got == values);
  int64_t emitted = 0;
  uint8_t frame[kFrame] = {}, action = 0;
  CHECK(t->Add(frame, &action, 0.0, false, false, -1.0, &emitted).code() ==
        Code::kInvalidArgument);
  CHECK(t->add_count() == 4);
}

TEST(AddBatchStoresWhatAddsStore) {
  auto one = MakeStore(7, 2, 3), batch = MakeStore(7, 2, 3);
  const int64_t k = 23;
  std::vector<uint8_t> frames(k * kFrame), actions(k), terms(k), ends(k);
  std::vector<double> rewards(k);
  std::vector<int64_t> emitted(k);
  int64_t total = 0;
  for (int64_t i = 0; i < k; ++i) {
    std::memset(&frames[i * kFrame], static_cast<int>(i + 1), kFrame);
    actions[i] = static_cast<uint8_t>(i % 4);
    rewards[i] = static_cast<double>(i);
    terms[i] = i % 9 == 8;
    ends[i] = i % 11 == 10;
    total += AddStep(*one, i, terms[i] != 0, ends[i] != 0);
  }
  CHECK(batch->AddBatch(k, frames.data(), actions.data(), rewards.data(), terms.data(),
                        ends.data(), nullptr, emitted.data()).ok());
  int64_t sum = 0;
  for (int64_t e : emitted) sum += e;
  CHECK(sum == total);
  CHECK(batch->add_count() == one->add_count() && batch->size() == one->size());
  CHECK(StoredKeys(*batch) == StoredKeys(*one));
  const auto keys = StoredKeys(*one);
  CHECK(SameElements(GatherKeys(*batch, keys), GatherKeys(*one, keys)));
  CHECK(batch->window_size() == one->window_size());
  // A prioritized store needs a priority per step, each checked first.
  auto p = MakeStore(7, 1, 1, true);
  CHECK(p->AddBatch(2, frames.data(), actions.data(), rewards.data(), terms.data(), ends.data(),
                    nullptr, emitted.data()).code() == Code::kInvalidArgument);
  const double pri[2] = {1.0, -2.0};
  CHECK(p->AddBatch(2, frames.data(), actions.data(), rewards.data(), terms.data(), ends.data(),
                    pri, emitted.data()).code() == Code::kInvalidArgument);
  CHECK(p->add_count() == 0 && p->window_size() == 0);
}

TEST(FeedDrawsGatherWhatGatherGives) {
  for (bool prioritized : {false, true}) {
    auto t = MakeStore(32, 3, 2, prioritized);
    for (int64_t k = 0; k < 60; ++k) AddStep(*t, k, k % 13 == 12, false, 0.5 + (k % 3));
    const int s = 3;
    const int64_t n = 9;
    Rng a(11), b(11);
    std::vector<int32_t> keys(n), keys2(n), index(n * 2 * s), counts(2);
    std::vector<double> prob(n), prob2(n), reward(n), reward2(n);
    std::vector<uint8_t> state(n * kFrame * s), next(n * kFrame * s), action(n), term(n),
        end(n), action2(n), term2(n), end2(n);
    const int64_t granule = 4;
    std::vector<uint8_t> frames(TransitionStore::DistinctFramesCapacity(n, s, granule) * kFrame);
    CHECK(t->SampleGather(&a, n, keys.data(), prob.data(), state.data(), action.data(),
                          reward.data(), next.data(), term.data(), end.data()).ok());
    CHECK(t->SampleDistinctFrames(&b, n, granule, keys2.data(), prob2.data(), frames.data(),
                                  index.data(), counts.data(), action2.data(), reward2.data(),
                                  term2.data(), end2.data()).ok());
    CHECK(keys == keys2 && prob == prob2 && reward == reward2 && action == action2);
    CHECK(counts[0] >= 1 && counts[0] <= 2 * n * s && counts[1] % granule == 0);
    // The stacks rebuilt from the distinct frames are SampleGather's.
    for (int64_t e = 0; e < n; ++e)
      for (int k = 0; k < s; ++k)
        for (size_t x = 0; x < kFrame; ++x) {
          CHECK(state[(e * kFrame + x) * s + k] == frames[index[(2 * e) * s + k] * kFrame + x]);
          CHECK(next[(e * kFrame + x) * s + k] == frames[index[(2 * e + 1) * s + k] * kFrame + x]);
        }
    for (int32_t i = counts[0] * static_cast<int32_t>(kFrame); i < counts[1] * int32_t(kFrame); ++i)
      CHECK(frames[i] == 0);  // the padding is zeros
    // And Gather of the drawn keys gives the same elements.
    std::vector<int64_t> k64(keys.begin(), keys.end());
    std::vector<uint8_t> state3(state.size()), next3(next.size()), a3(n), t3(n), e3(n);
    std::vector<double> r3(n);
    CHECK(t->Gather(k64.data(), n, state3.data(), a3.data(), r3.data(), next3.data(), t3.data(),
                    e3.data()).ok());
    CHECK(state3 == state && next3 == next && r3 == reward && t3 == term);
    if (!prioritized)
      for (double p : prob) CHECK(p == 1.0 / static_cast<double>(t->size()));
  }
  auto empty = MakeStore(4, 1, 1);
  Rng r(1);
  int32_t key;
  double prob, reward;
  uint8_t buf[kFrame], small = 0;
  CHECK(empty->SampleGather(&r, 1, &key, &prob, buf, &small, &reward, buf, &small, &small)
            .code() == Code::kFailedPrecondition);
}

TEST(ExportThenImportGivesTheSameStore) {
  for (bool prioritized : {false, true}) {
    auto t = MakeStore(10, 3, 2, prioritized);
    for (int64_t k = 0; k < 27; ++k) AddStep(*t, k, k % 8 == 7, false, 0.25 * (k % 5));
    CHECK(t->window_size() > 0);  // a trajectory in flight is part of the checkpoint
    const Exported ex(*t);
    auto u = MakeStore(10, 3, 2, prioritized);
    AddStep(*u, 99, false);
    CHECK(ex.ImportInto(*u).ok());
    CHECK(u->add_count() == t->add_count() && u->size() == t->size());
    CHECK(StoredKeys(*u) == StoredKeys(*t));
    const auto keys = StoredKeys(*t);
    CHECK(SameElements(GatherKeys(*u, keys), GatherKeys(*t, keys)));
    if (prioritized) {
      std::vector<double> pt(keys.size()), pu(keys.size());
      CHECK(t->Priorities(keys.data(), keys.size(), pt.data()).ok());
      CHECK(u->Priorities(keys.data(), keys.size(), pu.data()).ok());
      CHECK(pt == pu && t->tree_root() == u->tree_root());
    }
    // The next steps yield the same elements from both (the window was restored).
    for (int64_t k = 27; k < 33; ++k) CHECK(AddStep(*t, k, false) == AddStep(*u, k, false));
    const auto after = StoredKeys(*t);
    CHECK(SameElements(GatherKeys(*u, after), GatherKeys(*t, after)));
  }
}

TEST(CraftedCheckpointsAreRefusedChangingNothing) {
  auto t = MakeStore(10, 2, 1);
  for (int64_t k = 0; k < 15; ++k) AddStep(*t, k, false);
  const Exported good(*t);
  auto target = MakeStore(10, 2, 1);
  for (int64_t k = 0; k < 6; ++k) AddStep(*target, 100 + k, false);
  const auto keys_before = StoredKeys(*target);
  const auto elements_before = GatherKeys(*target, keys_before);
  const int64_t first = good.add_count - good.m;
  auto refused = [&](Exported ex) {
    CHECK(ex.ImportInto(*target).code() == Code::kDataLoss);
    CHECK(target->add_count() == 5 && StoredKeys(*target) == keys_before);
    CHECK(SameElements(GatherKeys(*target, keys_before), elements_before));
  };
  {
    Exported ex = good;
    ex.m = 11;  // more than max_capacity
    refused(ex);
  }
  {
    Exported ex = good;
    ex.add_count = ex.m - 1;
    refused(ex);
  }
  {
    Exported ex = good;
    ex.add_count = TransitionStore::kMaxAddCount + 1;
    refused(ex);
  }
  {
    Exported ex = good;
    ex.w = 4;  // more steps than horizon + stack
    refused(ex);
  }
  // Keys: a repeat, one past the stored range on each side, and keys anywhere in int64 (near
  // INT64_MIN, key - first overflowed before the range was checked: UndefinedBehaviorSanitizer
  // stops there).
  {
    Exported ex = good;
    ex.keys[0] = ex.keys[1];
    refused(ex);
  }
  for (int64_t bad : {first - 1, good.add_count, std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::min() + 3,
                      std::numeric_limits<int64_t>::max()}) {
    Exported ex = good;
    ex.keys[0] = bad;
    refused(ex);
  }
  {
    auto p = MakeStore(10, 2, 1, true);
    for (int64_t k = 0; k < 8; ++k) AddStep(*p, k, false);
    Exported ex(*p);
    ex.nodes[1] = std::numeric_limits<double>::quiet_NaN();
    auto q = MakeStore(10, 2, 1, true);
    CHECK(ex.ImportInto(*q).code() == Code::kDataLoss);
    CHECK(q->add_count() == 0 && q->size() == 0);
    ex.nodes[1] = -1.0;
    CHECK(ex.ImportInto(*q).code() == Code::kDataLoss);
  }
  // The genuine checkpoint still loads.
  CHECK(good.ImportInto(*target).ok());
  CHECK(target->add_count() == good.add_count);
}

TEST(AtTheCounterLimitAddsFailCleanly) {
  auto t = MakeStore(4, 1, 1);
  for (int64_t k = 0; k < 6; ++k) AddStep(*t, k, false);
  Exported ex(*t);
  const int64_t shift = TransitionStore::kMaxAddCount - ex.add_count;
  ex.add_count += shift;
  for (int64_t& k : ex.keys) k += shift;
  auto u = MakeStore(4, 1, 1);
  CHECK(ex.ImportInto(*u).ok());
  CHECK(u->add_count() == TransitionStore::kMaxAddCount);
  uint8_t frame[kFrame] = {1, 1, 1}, action = 0;
  int64_t emitted = -1;
  CHECK(u->Add(frame, &action, 0.0, false, false, 0.0, &emitted).code() ==
        Code::kResourceExhausted);
  CHECK(u->add_count() == TransitionStore::kMaxAddCount && u->size() == ex.m);
}

TEST_MAIN()
