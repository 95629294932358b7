#include "core/transition_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <shared_mutex>

#include "core/gather.h"

namespace memoire {

namespace {

// Dopamine sizes its tree with 2 ** ceil(log2(capacity)) leaves. Dopamine raises IndexError
// when an eviction needs leaf max_capacity of a full power-of-two tree; memoire adds a level
// there instead (the only case where the layouts differ).
int64_t LeavesFor(int64_t tree_capacity, int64_t max_capacity) {
  int64_t leaves = 1;
  while (leaves < tree_capacity) leaves *= 2;
  while (leaves < max_capacity + 1) leaves *= 2;
  return leaves;
}

Status NotStored(int64_t key) {
  return Error(Code::kNotFound, "key ", key, " is not stored").With("key", key);
}

}  // namespace

Status TransitionStore::Make(const Options& o, std::unique_ptr<TransitionStore>* out) {
  if (o.max_capacity < 1)
    return Error(Code::kInvalidArgument, "max_capacity: expected >= 1, got ", o.max_capacity);
  if (o.stack_size < 1 || o.stack_size > 64)
    return Error(Code::kInvalidArgument, "stack_size: expected 1..64, got ", o.stack_size);
  if (o.update_horizon < 1)
    return Error(Code::kInvalidArgument, "update_horizon: expected >= 1, got ", o.update_horizon);
  if (o.frame_bytes == 0 || o.elem_bytes == 0 || o.frame_bytes % o.elem_bytes != 0)
    return Error(Code::kInvalidArgument, "observation: expected a non-empty array, got ",
                 o.frame_bytes, " bytes");
  if (o.prioritized && o.tree_capacity < 1)
    return Error(Code::kInvalidArgument, "sampler max_capacity: expected >= 1, got ",
                 o.tree_capacity);
  std::unique_ptr<TransitionStore> store(new TransitionStore(o));
  if (!store->Allocated())
    return Error(Code::kResourceExhausted, "cannot reserve memory for max_capacity=",
                 o.max_capacity);
  *out = std::move(store);
  return Status::OK();
}

bool TransitionStore::Allocated() const {
  return e_state_end_.allocated() && e_next_end_.allocated() && e_state_valid_.allocated() &&
         e_next_valid_.allocated() && e_reward_.allocated() && e_terminal_.allocated() &&
         e_episode_end_.allocated() && e_action_.allocated() && key_by_index_.allocated() &&
         index_of_.allocated();
}

ReservedBytes TransitionStore::AllocFrames(int64_t cap, size_t frame_bytes) {
  ReservedBytes b(static_cast<size_t>(cap + 1) * frame_bytes);
  if (!b.data()) throw std::bad_alloc();
  return b;
}

TransitionStore::TransitionStore(const Options& o) : opt_(o) {
  const int64_t c = o.max_capacity;
  const int win = o.update_horizon + o.stack_size;
  // Long episodes need about one frame per element; the margin covers the window and the
  // terminal tails. Short episodes with a long horizon may need more: the ring then grows.
  frame_cap_ = c + 2 * win + 2;
  frames_ = AllocFrames(frame_cap_, o.frame_bytes);
  w_.resize(win);
  w_actions_.resize(static_cast<size_t>(win) * o.action_bytes);
  e_state_end_ = ReservedArray<int64_t>(c);
  e_next_end_ = ReservedArray<int64_t>(c);
  e_state_valid_ = ReservedArray<uint8_t>(c);
  e_next_valid_ = ReservedArray<uint8_t>(c);
  e_reward_ = ReservedArray<double>(c);
  e_terminal_ = ReservedArray<uint8_t>(c);
  e_episode_end_ = ReservedArray<uint8_t>(c);
  e_action_ = ReservedArray<uint8_t>(static_cast<size_t>(c) * o.action_bytes);
  key_by_index_ = ReservedArray<int64_t>(c + 1);
  index_of_ = ReservedArray<int64_t>(c + 1);
  if (o.prioritized) tree_ = SumTree(LeavesFor(o.tree_capacity, c), SumTree::Rule::kAddDeltas);
}

int64_t TransitionStore::add_count() const {
  std::shared_lock<RwLock> l(mu_);
  return add_count_;
}
int64_t TransitionStore::size() const {
  std::shared_lock<RwLock> l(mu_);
  return size_;
}
double TransitionStore::tree_root() const {
  std::shared_lock<RwLock> l(mu_);
  return opt_.prioritized ? tree_.Total() : 0.0;
}
int64_t TransitionStore::frame_capacity() const {
  std::shared_lock<RwLock> l(mu_);
  return frame_cap_;
}

// ---- frame ring ----

int64_t TransitionStore::OldestNeededPos() const {
  int64_t low = head_;
  if (size_ > 0) {
    const int64_t slot = (add_count_ - size_) % opt_.max_capacity;
    low = std::min(low, e_state_end_[slot] - e_state_valid_[slot] + 1);
  }
  if (w_len_ > 0) low = std::min(low, w_[0].pos);
  return low;
}

void TransitionStore::EnsureRoom(int64_t extra) {
  const int64_t low = OldestNeededPos();
  const int64_t need = head_ + extra - low;
  if (need <= frame_cap_) return;
  const int64_t cap = std::max(need, frame_cap_ + frame_cap_ / 4 + 1);
  ReservedBytes grown = AllocFrames(cap, opt_.frame_bytes);
  for (int64_t p = low; p < head_; ++p)
    std::memcpy(grown.data() + (p % cap) * opt_.frame_bytes, frame_at(p), opt_.frame_bytes);
  frames_ = std::move(grown);
  frame_cap_ = cap;
}

int64_t TransitionStore::PushFrame(const uint8_t* frame) {
  EnsureRoom(1);
  std::memcpy(frame_at(head_), frame, opt_.frame_bytes);
  return head_++;
}

int64_t TransitionStore::StackSlot(int64_t end, int valid, int k) const {
  const int s = opt_.stack_size;
  if (k < s - valid) return frame_cap_;  // the zero frame
  return (end - (s - 1 - k)) % frame_cap_;
}

// ---- accumulator ----

void TransitionStore::Emit(int i, int j, int first, bool terminal, double priority) {
  const int s = opt_.stack_size;
  const int n = opt_.update_horizon;
  const int64_t c = opt_.max_capacity;
  double reward = 0.0;
  const int stop = std::min(i + n - 1, j);
  for (int t = i; t <= stop; ++t) reward += w_[t].reward * std::pow(opt_.gamma, t - i);

  const int64_t key = add_count_;
  const int64_t slot = key % c;
  e_state_end_[slot] = w_[i].pos;
  e_state_valid_[slot] = static_cast<uint8_t>(std::min(s, i - first + 1));
  e_next_end_[slot] = w_[j].pos;
  e_next_valid_[slot] = static_cast<uint8_t>(std::min(s, j - first + 1));
  e_reward_[slot] = reward;
  e_terminal_[slot] = terminal;
  e_episode_end_[slot] = terminal;  // Dopamine sets episode_end from is_terminal
  if (opt_.action_bytes)
    std::memcpy(&e_action_[slot * opt_.action_bytes], &w_actions_[i * opt_.action_bytes],
                opt_.action_bytes);
  w_emitted_ = true;

  // Sampler add: the new key takes the next dense index.
  const int64_t index = size_;
  key_by_index_[index] = key;
  index_of_[key % (c + 1)] = index;
  ++size_;
  if (opt_.prioritized) tree_.Set(index, priority);
  ++add_count_;

  if (add_count_ > c) {  // evict the oldest key: swap it with the last dense index
    // Dopamine evicts by count (add_count > max_capacity), not by size: after add_count was
    // set (or a checkpoint restored) the store may hold fewer than c keys here. The stored keys
    // are always [add_count_ - size_, add_count_), so the oldest is the first of them.
    const int64_t oldest = add_count_ - size_;
    const int64_t idx = DenseIndexOf(oldest);
    const int64_t last = size_ - 1;
    if (opt_.prioritized) {
      // Dopamine's remove: the last index's value moves to the freed one, the last is zeroed.
      if (idx == last) {
        tree_.Set(idx, 0.0);
      } else {
        const int64_t ii[2] = {idx, last};
        const double vv[2] = {tree_.Get(last), 0.0};
        tree_.SetMany(ii, vv, 2);
      }
    }
    std::swap(key_by_index_[idx], key_by_index_[last]);
    index_of_[key_by_index_[idx] % (c + 1)] = idx;
    --size_;
  }
}

void TransitionStore::ClearWindow() {
  // A trajectory that yielded nothing gives its frames back.
  if (!w_emitted_ && w_start_pos_ >= 0) head_ = w_start_pos_;
  w_len_ = 0;
  w_start_pos_ = -1;
  w_emitted_ = false;
}

Status TransitionStore::Add(const uint8_t* frame, const uint8_t* action, double reward,
                            bool terminal, bool episode_end, double priority, int64_t* emitted) {
  if (opt_.prioritized && !(priority >= 0.0) )
    return Error(Code::kInvalidArgument, "priority: expected a value >= 0, got ", priority);
  std::lock_guard<RwLock> l(mu_);
  MEMOIRE_RETURN_IF_ERROR(CheckRoomLocked(1));
  *emitted = AddLocked(frame, action, reward, terminal, episode_end, priority);
  return Status::OK();
}

Status TransitionStore::AddBatch(int64_t k, const uint8_t* frames, const uint8_t* actions,
                                 const double* rewards, const uint8_t* terminals,
                                 const uint8_t* episode_ends, const double* priorities,
                                 int64_t* emitted) {
  if (k < 0) return Error(Code::kInvalidArgument, "steps: expected >= 0, got ", k);
  if (opt_.prioritized) {
    if (priorities == nullptr && k > 0)
      return Error(Code::kInvalidArgument, "priorities: a prioritized store needs one per step");
    for (int64_t b = 0; b < k; ++b)
      if (!(priorities[b] >= 0.0))
        return Error(Code::kInvalidArgument, "priorities[", b, "]: expected a value >= 0, got ",
                     priorities[b]);
  }
  std::lock_guard<RwLock> l(mu_);
  MEMOIRE_RETURN_IF_ERROR(CheckRoomLocked(k));
  for (int64_t b = 0; b < k; ++b) {
    emitted[b] = AddLocked(frames + b * opt_.frame_bytes, actions + b * opt_.action_bytes,
                           rewards[b], terminals[b] != 0, episode_ends[b] != 0,
                           priorities == nullptr ? 0.0 : priorities[b]);
  }
  return Status::OK();
}

Status TransitionStore::CheckRoomLocked(int64_t k) const {
  const int64_t per_step = opt_.update_horizon + opt_.stack_size;
  if (k > (kMaxAddCount - add_count_) / per_step)
    return Error(Code::kResourceExhausted, "add_count: ", k, " more step(s) from ", add_count_,
                 " could pass the limit 2**31 (keys are int32, as Dopamine's)");
  return Status::OK();
}

int64_t TransitionStore::AddLocked(const uint8_t* frame, const uint8_t* action, double reward,
                                   bool terminal, bool episode_end, double priority) {
  const int s = opt_.stack_size;
  const int n = opt_.update_horizon;
  const int win = n + s;
  const int64_t before = add_count_;

  // Append (the window keeps the last n + s steps).
  if (w_len_ == win) {
    std::memmove(w_.data(), w_.data() + 1, sizeof(Step) * (win - 1));
    std::memmove(w_actions_.data(), w_actions_.data() + opt_.action_bytes,
                 opt_.action_bytes * (win - 1));
    --w_len_;
  }
  const int64_t pos = PushFrame(frame);
  if (w_start_pos_ < 0) w_start_pos_ = pos;
  w_[w_len_] = Step{pos, reward, terminal, episode_end};
  if (opt_.action_bytes)
    std::memcpy(&w_actions_[w_len_ * opt_.action_bytes], action, opt_.action_bytes);
  ++w_len_;

  const int L = w_len_;
  if (terminal) {
    // Dopamine: while an element is valid, yield it and pop the oldest step. `f` stands for
    // the pops (the window itself is cleared afterwards).
    int last_i = -1;
    for (int f = 0; L - f > 1; ++f) {
      const int len = L - f;
      const int h = len > n ? n : len - 1;
      const int i = L - 1 - h;
      if (opt_.fix_terminal_duplicates) {
        if (i != last_i) Emit(i, L - 1, 0, true, priority);
      } else {
        Emit(i, L - 1, f, true, priority);
      }
      last_i = i;
    }
    ClearWindow();
  } else {
    if (L > n) Emit(L - 1 - n, L - 1, 0, false, priority);
    if (episode_end) ClearWindow();
  }
  return add_count_ - before;
}

// ---- sampling, update, gather ----

Status TransitionStore::KeysAt(const int64_t* indices, int64_t n, int32_t* keys) const {
  std::shared_lock<RwLock> l(mu_);
  for (int64_t b = 0; b < n; ++b)
    if (indices[b] < 0 || indices[b] >= size_)
      return Error(Code::kOutOfRange, "indices: expected values in [0, ", size_, "), got ",
                   indices[b])
          .With("index", indices[b])
          .With("bound", size_);
  for (int64_t b = 0; b < n; ++b) keys[b] = static_cast<int32_t>(key_by_index_[indices[b]]);
  return Status::OK();
}

Status TransitionStore::Query(const double* targets, int64_t n, int32_t* keys,
                              double* probabilities) const {
  std::shared_lock<RwLock> l(mu_);
  if (!opt_.prioritized || tree_.Total() == 0.0)
    return Error(Code::kFailedPrecondition, "prioritized query on an empty sum tree");
  const double root = tree_.Total();
  std::vector<int64_t> idx(n);
  for (int64_t b = 0; b < n; ++b) {
    if (!(targets[b] >= 0.0 && targets[b] < root))
      return Error(Code::kInvalidArgument, "targets: expected values in [0, ", root,
                   ") (the tree's total), got ", targets[b]);
    idx[b] = tree_.Descend(targets[b]);
    if (idx[b] >= size_)  // rounding drift into padding: Dopamine raises IndexError here too
      return Error(Code::kOutOfRange, "sum tree query reached empty leaf ", idx[b], " of ",
                   size_, " stored")
          .With("index", idx[b])
          .With("bound", size_);
  }
  for (int64_t b = 0; b < n; ++b) {
    keys[b] = static_cast<int32_t>(key_by_index_[idx[b]]);
    probabilities[b] = tree_.Get(idx[b]) / root;
  }
  return Status::OK();
}

Status TransitionStore::Update(const int64_t* keys, const double* values, int64_t n) {
  std::lock_guard<RwLock> l(mu_);
  if (!opt_.prioritized)
    return Error(Code::kFailedPrecondition, "update: the buffer is not prioritized");
  std::vector<int64_t> idx(n);
  for (int64_t b = 0; b < n; ++b) {
    if (!Live(keys[b])) return NotStored(keys[b]);
    if (!(values[b] >= 0.0))
      return Error(Code::kInvalidArgument, "priorities: expected values >= 0, got ", values[b]);
    idx[b] = DenseIndexOf(keys[b]);
  }
  tree_.SetMany(idx.data(), values, n);
  return Status::OK();
}

Status TransitionStore::Priorities(const int64_t* keys, int64_t n, double* out) const {
  std::shared_lock<RwLock> l(mu_);
  for (int64_t b = 0; b < n; ++b)
    if (!Live(keys[b])) return NotStored(keys[b]);
  for (int64_t b = 0; b < n; ++b)
    out[b] = opt_.prioritized ? tree_.Get(DenseIndexOf(keys[b])) : 1.0;
  return Status::OK();
}

Status TransitionStore::Gather(const int64_t* keys, int64_t n, uint8_t* state, uint8_t* action,
                               double* reward, uint8_t* next_state, uint8_t* terminal,
                               uint8_t* episode_end) const {
  std::shared_lock<RwLock> l(mu_);
  for (int64_t b = 0; b < n; ++b)
    if (!Live(keys[b])) return NotStored(keys[b]);
  GatherLocked(keys, n, state, action, reward, next_state, terminal, episode_end);
  return Status::OK();
}

Status TransitionStore::DrawLocked(Rng* rng, int64_t n, int64_t* keys,
                                   double* probabilities) const {
  const double root = opt_.prioritized ? tree_.Total() : 0.0;
  if (root > 0.0) {
    for (int64_t b = 0; b < n; ++b) {
      const int64_t idx = tree_.Descend(rng->Uniform() * root);
      if (idx >= size_)  // rounding drift into padding, as Query
        return Error(Code::kOutOfRange, "sum tree query reached empty leaf ", idx, " of ", size_,
                     " stored")
            .With("index", idx)
            .With("bound", size_);
      keys[b] = key_by_index_[idx];
      probabilities[b] = tree_.Get(idx) / root;
    }
  } else {
    for (int64_t b = 0; b < n; ++b) {
      keys[b] = key_by_index_[static_cast<int64_t>(rng->Below(static_cast<uint64_t>(size_)))];
      probabilities[b] = 1.0 / static_cast<double>(size_);
    }
  }
  return Status::OK();
}

Status TransitionStore::SampleGather(Rng* rng, int64_t n, int32_t* keys, double* probabilities,
                                     uint8_t* state, uint8_t* action, double* reward,
                                     uint8_t* next_state, uint8_t* terminal,
                                     uint8_t* episode_end) const {
  std::shared_lock<RwLock> l(mu_);
  if (size_ == 0) return Error(Code::kFailedPrecondition, "no elements stored to sample from")
                         .With("needed", 1);
  std::vector<int64_t> k64(n);
  MEMOIRE_RETURN_IF_ERROR(DrawLocked(rng, n, k64.data(), probabilities));
  for (int64_t b = 0; b < n; ++b) keys[b] = static_cast<int32_t>(k64[b]);
  GatherLocked(k64.data(), n, state, action, reward, next_state, terminal, episode_end);
  return Status::OK();
}

Status TransitionStore::SampleDistinctFrames(Rng* rng, int64_t n, int64_t granule, int32_t* keys,
                                             double* probabilities, uint8_t* frames,
                                             int32_t* index, int32_t* counts, uint8_t* action,
                                             double* reward, uint8_t* terminal,
                                             uint8_t* episode_end) const {
  if (granule < 1) return Error(Code::kInvalidArgument, "granule: expected >= 1, got ", granule);
  std::shared_lock<RwLock> l(mu_);
  if (size_ == 0) return Error(Code::kFailedPrecondition, "no elements stored to sample from")
                         .With("needed", 1);
  const int s = opt_.stack_size;
  std::vector<int64_t> k64(n);
  MEMOIRE_RETURN_IF_ERROR(DrawLocked(rng, n, k64.data(), probabilities));
  for (int64_t b = 0; b < n; ++b) keys[b] = static_cast<int32_t>(k64[b]);
  std::vector<int64_t> ss(n * s), ns(n * s);
  FieldsLocked(k64.data(), n, ss.data(), ns.data(), action, reward, terminal, episode_end);
  // Distinct ring slots in ascending order (reads the ring forward); each reference then
  // finds its frame by binary search: O(n * stack * log) on a few thousand integers.
  std::vector<int64_t> distinct(ss);
  distinct.insert(distinct.end(), ns.begin(), ns.end());
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  auto frame_of = [&](int64_t slot) {
    return static_cast<int32_t>(std::lower_bound(distinct.begin(), distinct.end(), slot) -
                                distinct.begin());
  };
  for (int64_t b = 0; b < n; ++b)
    for (int k = 0; k < s; ++k) {
      index[(2 * b) * s + k] = frame_of(ss[b * s + k]);
      index[(2 * b + 1) * s + k] = frame_of(ns[b * s + k]);
    }
  const int64_t u = static_cast<int64_t>(distinct.size());
  const int64_t padded = (u + granule - 1) / granule * granule;
  GatherRows(frames_.data(), opt_.frame_bytes, distinct.data(), u, frames);
  // Zeros, not stale bytes of an earlier batch, in the padding the device receives.
  std::memset(frames + u * opt_.frame_bytes, 0, (padded - u) * opt_.frame_bytes);
  counts[0] = static_cast<int32_t>(u);
  counts[1] = static_cast<int32_t>(padded);
  return Status::OK();
}

void TransitionStore::FieldsLocked(const int64_t* keys, int64_t n, int64_t* ss, int64_t* ns,
                                   uint8_t* action, double* reward, uint8_t* terminal,
                                   uint8_t* episode_end) const {
  const int s = opt_.stack_size;
  const int64_t c = opt_.max_capacity;
  for (int64_t b = 0; b < n; ++b) {
    const int64_t slot = keys[b] % c;
    for (int k = 0; k < s; ++k) {
      ss[b * s + k] = StackSlot(e_state_end_[slot], e_state_valid_[slot], k);
      ns[b * s + k] = StackSlot(e_next_end_[slot], e_next_valid_[slot], k);
    }
    if (opt_.action_bytes)
      std::memcpy(action + b * opt_.action_bytes, &e_action_[slot * opt_.action_bytes],
                  opt_.action_bytes);
    reward[b] = e_reward_[slot];
    terminal[b] = e_terminal_[slot];
    episode_end[b] = e_episode_end_[slot];
  }
}

void TransitionStore::GatherLocked(const int64_t* keys, int64_t n, uint8_t* state,
                                   uint8_t* action, double* reward, uint8_t* next_state,
                                   uint8_t* terminal, uint8_t* episode_end) const {
  const int s = opt_.stack_size;
  std::vector<int64_t> ss(n * s), ns(n * s);
  FieldsLocked(keys, n, ss.data(), ns.data(), action, reward, terminal, episode_end);
  const int64_t row_elems = static_cast<int64_t>(opt_.frame_bytes / opt_.elem_bytes);
  GatherStackChannelLast(frames_.data(), opt_.elem_bytes, row_elems, ss.data(), n, s, state);
  GatherStackChannelLast(frames_.data(), opt_.elem_bytes, row_elems, ns.data(), n, s, next_state);
}

void TransitionStore::Clear() {
  std::lock_guard<RwLock> l(mu_);
  add_count_ = 0;
  size_ = 0;
  w_len_ = 0;
  w_start_pos_ = -1;
  w_emitted_ = false;
  head_ = 0;
  tree_.Clear();
}

void TransitionStore::ClearTrajectory() {
  std::lock_guard<RwLock> l(mu_);
  ClearWindow();
}

// ---- checkpoints ----

void TransitionStore::ExportSampler(int64_t* key_by_index, double* nodes) const {
  std::shared_lock<RwLock> l(mu_);
  std::copy(key_by_index_.begin(), key_by_index_.begin() + size_, key_by_index);
  if (nodes && opt_.prioritized) std::copy(tree_.heap(), tree_.heap() + tree_.heap_size(), nodes);
}

int64_t TransitionStore::window_size() const {
  std::shared_lock<RwLock> l(mu_);
  return w_len_;
}

void TransitionStore::ExportWindow(uint8_t* frames, uint8_t* actions, double* rewards,
                                   uint8_t* terminals, uint8_t* episode_ends) const {
  std::shared_lock<RwLock> l(mu_);
  for (int k = 0; k < w_len_; ++k) {
    std::memcpy(frames + k * opt_.frame_bytes, frame_at(w_[k].pos), opt_.frame_bytes);
    rewards[k] = w_[k].reward;
    terminals[k] = w_[k].terminal;
    episode_ends[k] = w_[k].episode_end;
  }
  if (opt_.action_bytes)
    std::memcpy(actions, w_actions_.data(), opt_.action_bytes * w_len_);
}

Status TransitionStore::Import(int64_t add_count, int64_t m, const uint8_t* states,
                               const uint8_t* actions, const double* rewards,
                               const uint8_t* next_states, const uint8_t* terminals,
                               const uint8_t* episode_ends, const int64_t* key_by_index,
                               const double* nodes, int64_t w, const uint8_t* win_frames,
                               const uint8_t* win_actions, const double* win_rewards,
                               const uint8_t* win_terminals, const uint8_t* win_episode_ends) {
  const int s = opt_.stack_size;
  const int64_t c = opt_.max_capacity;
  if (m < 0 || m > c)
    return Error(Code::kDataLoss, "checkpoint holds ", m, " elements; max_capacity is ", c);
  if (add_count < m || add_count > kMaxAddCount)
    return Error(Code::kDataLoss, "checkpoint add_count ", add_count, ": expected ", m,
                 " (its elements) <= add_count <= 2**31");
  if (w < 0 || w > opt_.update_horizon + s)
    return Error(Code::kDataLoss, "checkpoint accumulator holds ", w, " steps; expected <= ",
                 opt_.update_horizon + s);
  {
    // The range is checked before any arithmetic on a key: a key from the file may be any
    // int64 (key - first would overflow for one near INT64_MIN).
    const int64_t first = add_count - m;
    std::vector<uint8_t> seen(m, 0);
    for (int64_t k = 0; k < m; ++k) {
      const int64_t key = key_by_index[k];
      if (key < first || key >= add_count)
        return Error(Code::kDataLoss, "checkpoint sampler keys are not the stored keys: key ",
                     key, " at index ", k, " is outside [", first, ", ", add_count, ")");
      if (seen[key - first])
        return Error(Code::kDataLoss, "checkpoint sampler keys are not the stored keys: key ",
                     key, " appears twice");
      seen[key - first] = 1;
    }
  }
  if (opt_.prioritized && nodes) {
    for (int64_t k = 0; k < num_nodes(); ++k)
      if (!(nodes[k] >= 0.0) || !std::isfinite(nodes[k]))
        return Error(Code::kDataLoss, "checkpoint sum tree node ", k, " is ", nodes[k]);
  }

  // Build into a fresh store, then swap: a failed import changes nothing.
  TransitionStore t(opt_);
  const size_t fb = opt_.frame_bytes;
  const size_t eb = opt_.elem_bytes;
  const int64_t row_elems = static_cast<int64_t>(fb / eb);
  const size_t stack_bytes = fb * s;
  std::vector<uint8_t> planes(stack_bytes);
  int64_t low_water = 0;
  // Stores one channel-last stack as s consecutive frames, reusing recent frames when an
  // identical run exists at or after low_water; returns the end position.
  auto store_stack = [&](const uint8_t* stack) -> int64_t {
    for (int k = 0; k < s; ++k)  // de-interleave into planes[k]
      for (int64_t e = 0; e < row_elems; ++e)
        std::memcpy(&planes[k * fb + e * eb], stack + (e * s + k) * eb, eb);
    auto same = [&](int64_t pos, int k) {
      return std::memcmp(t.frame_at(pos), &planes[k * fb], fb) == 0;
    };
    const int64_t window = opt_.update_horizon + 2 * s + 2;
    for (int64_t d = 0; d < window; ++d) {  // an identical run ending d frames back
      const int64_t end = t.head_ - 1 - d;
      if (end - s + 1 < low_water) break;
      bool ok = true;
      for (int k = s - 1; k >= 0 && ok; --k) ok = same(end - (s - 1 - k), k);
      if (ok) return end;
    }
    int overlap = 0;  // the longest tail of the ring equal to the first frames of the stack
    for (int o = s - 1; o >= 1 && overlap == 0; --o) {
      if (t.head_ - o < low_water) continue;
      bool ok = true;
      for (int k = 0; k < o && ok; ++k) ok = same(t.head_ - o + k, k);
      if (ok) overlap = o;
    }
    for (int k = overlap; k < s; ++k) {
      if (t.head_ + 1 > t.frame_cap_) {  // grow, keeping everything from position 0
        const int64_t cap = t.frame_cap_ + t.frame_cap_ / 2 + s;
        ReservedBytes grown = AllocFrames(cap, fb);
        for (int64_t p = 0; p < t.head_; ++p)
          std::memcpy(grown.data() + (p % cap) * fb, t.frame_at(p), fb);
        t.frames_ = std::move(grown);
        t.frame_cap_ = cap;
      }
      std::memcpy(t.frame_at(t.head_), &planes[k * fb], fb);
      ++t.head_;
    }
    return t.head_ - 1;
  };

  const int64_t first_key = add_count - m;
  for (int64_t k = 0; k < m; ++k) {
    const int64_t slot = (first_key + k) % c;
    const int64_t se = store_stack(states + k * stack_bytes);
    low_water = se - s + 1;
    const int64_t ne = store_stack(next_states + k * stack_bytes);
    t.e_state_end_[slot] = se;
    t.e_state_valid_[slot] = static_cast<uint8_t>(s);
    t.e_next_end_[slot] = ne;
    t.e_next_valid_[slot] = static_cast<uint8_t>(s);
    t.e_reward_[slot] = rewards[k];
    t.e_terminal_[slot] = terminals[k] != 0;
    t.e_episode_end_[slot] = episode_ends[k] != 0;
    if (opt_.action_bytes)
      std::memcpy(&t.e_action_[slot * opt_.action_bytes], actions + k * opt_.action_bytes,
                  opt_.action_bytes);
  }
  t.add_count_ = add_count;
  t.size_ = m;
  for (int64_t k = 0; k < m; ++k) {
    t.key_by_index_[k] = key_by_index[k];
    t.index_of_[key_by_index[k] % (c + 1)] = k;
  }
  if (opt_.prioritized && nodes) t.tree_.SetHeap(nodes);
  for (int64_t k = 0; k < w; ++k) {
    const int64_t pos = t.PushFrame(win_frames + k * fb);
    if (k == 0) t.w_start_pos_ = pos;
    t.w_[k] = Step{pos, win_rewards[k], win_terminals[k] != 0, win_episode_ends[k] != 0};
    t.w_len_ = static_cast<int>(k + 1);
  }
  if (opt_.action_bytes && w)
    std::memcpy(t.w_actions_.data(), win_actions, opt_.action_bytes * w);

  std::lock_guard<RwLock> l(mu_);
  frames_.swap(t.frames_);
  frame_cap_ = t.frame_cap_;
  head_ = t.head_;
  w_.swap(t.w_);
  w_actions_.swap(t.w_actions_);
  w_len_ = t.w_len_;
  w_start_pos_ = t.w_start_pos_;
  w_emitted_ = false;
  e_state_end_.swap(t.e_state_end_);
  e_next_end_.swap(t.e_next_end_);
  e_state_valid_.swap(t.e_state_valid_);
  e_next_valid_.swap(t.e_next_valid_);
  e_reward_.swap(t.e_reward_);
  e_terminal_.swap(t.e_terminal_);
  e_episode_end_.swap(t.e_episode_end_);
  e_action_.swap(t.e_action_);
  add_count_ = t.add_count_;
  size_ = t.size_;
  key_by_index_.swap(t.key_by_index_);
  index_of_.swap(t.index_of_);
  std::swap(tree_, t.tree_);
  return Status::OK();
}

}  // namespace memoire
