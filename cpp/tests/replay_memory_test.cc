// ReplayMemory: ring wrap for capacities that are not powers of two, eviction of whole oldest
// episodes (ring and max_episode), validity of sampled entries, stale ids, failed calls that
// change nothing.
#include "core/replay_memory.h"

#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <set>
#include <vector>

#include "tests/small_memory.h"
#include "tests/testing.h"

using namespace memoire;

namespace {

// The tests here store the episode number in i.
std::unique_ptr<ReplayMemory> Make(int64_t max_step) { return memoire_test::MakeSmallMemory(max_step, 1); }

struct Model {
  struct Ep { int64_t start, len; bool terminal; };
  std::deque<Ep> eps;
  int64_t tail = 0;
  int64_t cap;
  int64_t max_episode = 0;
  int fs = 1, ms = 1;
  explicit Model(int64_t c) : cap(c) {}
  void Add(int64_t len, bool terminal) {
    while (!eps.empty() && tail + len - eps.front().start > cap) eps.pop_front();
    eps.push_back({tail, len, terminal});
    tail += len;
    while (max_episode > 0 && static_cast<int64_t>(eps.size()) > max_episode) eps.pop_front();
  }
  int64_t size() const { return eps.empty() ? 0 : tail - eps.front().start; }
  std::set<int64_t> Sampleable() const {
    std::set<int64_t> s;
    for (const Ep& e : eps)
      for (int64_t k = fs - 1; k + ms <= e.len - 1; ++k) s.insert(e.start + k);
    return s;
  }
  const Ep* Find(int64_t pos) const {
    for (const Ep& e : eps)
      if (pos >= e.start && pos < e.start + e.len) return &e;
    return nullptr;
  }
};

Status AddEpisode(ReplayMemory& m, int64_t first, int64_t len, int32_t ep, bool terminal) {
  std::vector<int64_t> s(len);
  std::vector<float> zeros(len, 0.0f), ones(len, 1.0f);
  std::vector<int32_t> info(len, ep);
  for (int64_t k = 0; k < len; ++k) s[k] = first + k;
  const void* fields[ReplayMemory::kNumFields] = {s.data(),     zeros.data(), ones.data(),
                                                  zeros.data(), zeros.data(), nullptr,
                                                  info.data()};
  MEMOIRE_RETURN_IF_ERROR(m.NewEpisode());
  MEMOIRE_RETURN_IF_ERROR(m.AddEntries(len, fields, ones.data()));
  return m.CloseEpisode(1.0f, true, true, terminal);
}

// Samples n entries and checks ids, stacks and done flags against the model.
void CheckSample(ReplayMemory& m, const Model& model, int64_t n) {
  const int fs = model.fs;
  std::vector<int64_t> prev(n * fs), next(n * fs), id(n);
  std::vector<int32_t> prev_ep(n * fs);
  std::vector<uint8_t> done(n);
  ReplayMemory::SampleOut out;
  out.prev[ReplayMemory::kState] = reinterpret_cast<uint8_t*>(prev.data());
  out.next[ReplayMemory::kState] = reinterpret_cast<uint8_t*>(next.data());
  out.prev[ReplayMemory::kInfo] = reinterpret_cast<uint8_t*>(prev_ep.data());
  out.id = id.data();
  out.done = done.data();
  out.frame_stack = fs;
  CHECK(m.Sample(n, out).ok());
  const std::set<int64_t> ok = model.Sampleable();
  for (int64_t b = 0; b < n; ++b) {
    CHECK(ok.count(id[b]) == 1);
    const Model::Ep* e = model.Find(id[b]);
    if (!e) continue;
    for (int j = 0; j < fs; ++j) {
      CHECK(prev[b * fs + j] == id[b] - (fs - 1) + j);
      CHECK(next[b * fs + j] == id[b] - (fs - 1) + j + model.ms);
      CHECK(prev_ep[b * fs + j] == prev_ep[b * fs + fs - 1]);
    }
    CHECK(static_cast<bool>(done[b]) == (e->terminal && id[b] + model.ms == e->start + e->len - 1));
  }
}

}  // namespace

TEST(RingWrapsForAnyCapacity) {
  for (int64_t cap : {2, 3, 7, 13, 100}) {
    auto m = Make(cap);
    Model model(cap);
    int64_t first = 0;
    for (int k = 0; k < 3 * static_cast<int>(cap) + 5; ++k) {
      const int64_t len = 1 + (k * 7 + 3) % cap;  // 1..cap, varied
      const bool terminal = k % 3 != 0;
      CHECK(AddEpisode(*m, first, len, k, terminal).ok());
      model.Add(len, terminal);
      first += len;
      CHECK(m->num_episode() == static_cast<int64_t>(model.eps.size()));
      CHECK(m->size() == model.size());
      CHECK(m->size() <= cap);
      CHECK(m->num_sampleable() == static_cast<int64_t>(model.Sampleable().size()));
      if (m->num_sampleable() > 0) CheckSample(*m, model, 50);
    }
    CHECK(m->total_added() == static_cast<uint64_t>(first));
  }
}

TEST(FrameStackAndMultiStepValidity) {
  auto m = Make(13);
  Model model(13);
  ReplayMemory::Options o = m->options();
  o.frame_stack = 3;
  o.multi_step = 2;
  CHECK(m->SetOptions(o).ok());
  model.fs = 3;
  model.ms = 2;
  int64_t first = 0;
  for (int k = 0; k < 40; ++k) {
    const int64_t len = 1 + (k * 5) % 9;
    CHECK(AddEpisode(*m, first, len, k, k % 2).ok());
    model.Add(len, k % 2);
    first += len;
    CHECK(m->num_sampleable() == static_cast<int64_t>(model.Sampleable().size()));
    if (m->num_sampleable() > 0) CheckSample(*m, model, 64);
  }
  // frame_stack + multi_step > max_step is refused and changes nothing.
  o.frame_stack = 12;
  CHECK(!m->SetOptions(o).ok());
  CHECK(m->options().frame_stack == 3);
  // Outputs sized for another frame_stack are refused before anything is written.
  int64_t id = -7;
  int now = 0;
  ReplayMemory::SampleOut out;
  out.id = &id;
  out.frame_stack = 1;
  out.frame_stack_now = &now;
  if (m->num_sampleable() > 0) {
    CHECK(!m->Sample(1, out).ok());
    CHECK(id == -7 && now == 3);
  }
}

TEST(MaxEpisodeEvicts) {
  auto m = Make(100);
  Model model(100);
  ReplayMemory::Options o = m->options();
  o.max_episode = 3;
  CHECK(m->SetOptions(o).ok());
  model.max_episode = 3;
  for (int k = 0; k < 10; ++k) {
    CHECK(AddEpisode(*m, k * 4, 4, k, true).ok());
    model.Add(4, true);
    CHECK(m->num_episode() == static_cast<int64_t>(model.eps.size()));
    CHECK(m->size() == model.size());
  }
  o.max_episode = 1;
  CHECK(m->SetOptions(o).ok());
  CHECK(m->num_episode() == 1 && m->size() == 4 && m->num_sampleable() == 3);
}

TEST(TooLongEpisodeFailsAndChangesNothing) {
  auto m = Make(7);
  CHECK(AddEpisode(*m, 0, 5, 0, true).ok());
  std::vector<int64_t> s(8, 0);
  std::vector<float> f(8, 1.0f);
  std::vector<int32_t> info(8, 1);
  const void* fields[ReplayMemory::kNumFields] = {s.data(), f.data(), f.data(), f.data(),
                                                  f.data(), nullptr,  info.data()};
  CHECK(m->NewEpisode().ok());
  Status st = m->AddEntries(8, fields, f.data());
  CHECK(st.code() == Code::kResourceExhausted);
  CHECK(m->num_episode() == 1 && m->size() == 5 && m->open_length() == 0);
  f[3] = -1.0f;
  CHECK(m->AddEntries(4, fields, f.data()).code() == Code::kInvalidArgument);
  CHECK(m->size() == 5 && m->open_length() == 0);
  CHECK(m->CloseEpisode(1.0f, true, true, true).code() == Code::kFailedPrecondition);
  CHECK(m->NewEpisode().ok());
  f[3] = 1.0f;
  CHECK(m->AddEntries(7, fields, f.data()).ok());  // exactly max_step: evicts the rest
  CHECK(m->num_episode() == 0 && m->size() == 7);
  CHECK(m->CloseEpisode(1.0f, true, true, true).ok());
  CHECK(m->CloseEpisode(1.0f, true, true, true).code() == Code::kFailedPrecondition);
}

TEST(StaleIdsAreSkipped) {
  auto m = Make(7);
  CHECK(AddEpisode(*m, 0, 4, 0, true).ok());   // ids 0..3
  CHECK(AddEpisode(*m, 4, 3, 1, true).ok());   // ids 4..6
  CHECK(AddEpisode(*m, 7, 4, 2, true).ok());   // ids 7..10: evicts ids 0..3
  const int64_t ids[] = {0, 1, 4, 7, 8, 10, -1, 11};
  const float w[] = {5, 5, 5, 5, 5, 5, 5, 5};
  int64_t updated = -1;
  CHECK(m->UpdateWeights(8, ids, w, &updated).ok());
  CHECK(updated == 3);  // 4, 7, 8 (10 is the last entry, 0 and 1 are stale)
  CHECK(m->total_weight() == 5 + 1 + 5 + 5 + 1);
  const float bad[] = {1.0f, -2.0f};
  CHECK(m->UpdateWeights(2, ids, bad, &updated).code() == Code::kInvalidArgument);
  CHECK(m->total_weight() == 17);
}

TEST(WeightsSaturateInsteadOfOverflowing) {
  auto m = Make(10);
  std::vector<int64_t> s(3, 0);
  std::vector<float> f(3, 3e38f);
  std::vector<int32_t> info(3, 0);
  const void* fields[ReplayMemory::kNumFields] = {s.data(), f.data(), f.data(), f.data(),
                                                  f.data(), nullptr,  info.data()};
  CHECK(m->NewEpisode().ok());
  CHECK(m->AddEntries(3, fields, f.data()).ok());
  CHECK(m->CloseEpisode(10.0f, true, true, true).ok());
  CHECK(std::isfinite(m->total_weight()) && m->total_weight() > 0);
  CHECK(m->num_sampleable() == 2);
}

TEST(NonFiniteRewardsValuesAndProbsAreRefusedUnlessAllowed) {
  auto m = Make(10);
  std::vector<int64_t> s(3, 0);
  std::vector<float> a(3, 0.0f), r(3, 1.0f), p(3, 0.5f), v(3, 0.0f), w(3, 1.0f);
  std::vector<int32_t> info(3, 0);
  const void* fields[ReplayMemory::kNumFields] = {s.data(), a.data(), r.data(), p.data(),
                                                  v.data(), nullptr,  info.data()};
  CHECK(m->NewEpisode().ok());
  for (float* bad : {&r[2], &p[1], &v[0]}) {
    const float keep = *bad;
    *bad = std::nanf("");
    CHECK(m->AddEntries(3, fields, w.data()).code() == Code::kInvalidArgument);
    *bad = INFINITY;
    CHECK(m->CheckFinite(3, fields, w.data()).code() == Code::kInvalidArgument);
    *bad = keep;
  }
  a[1] = INFINITY;  // a is not a reward, prob or value: no rule applies
  CHECK(m->open_length() == 0 && m->AddEntries(3, fields, w.data()).ok());
  r[0] = -INFINITY;
  ReplayMemory::Options o = m->options();
  o.allow_nonfinite = true;
  CHECK(m->SetOptions(o).ok());
  CHECK(m->AddEntries(3, fields, w.data()).ok() && m->open_length() == 6);
  w[0] = NAN;  // weights never are
  CHECK(m->AddEntries(3, fields, w.data()).code() == Code::kInvalidArgument);
}

TEST_MAIN()
