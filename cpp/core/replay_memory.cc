#include "core/replay_memory.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <shared_mutex>
#include <sstream>
#include <system_error>
#include <thread>

#include "core/gather.h"

namespace memoire {

static_assert(ReplayMemory::kNumFields == protocol::kNumFields &&
                  ReplayMemory::kQvest == protocol::kQvestField,
              "core/protocol.h names the memory's fields in schema order");

namespace {
bool Finite(double x) { return std::isfinite(x); }

// The columns' schema: with compressed states the state field has no bytes there (its rows
// live in CompressedRows), so the columns reserve nothing for it.
Schema ColumnSchema(const Schema& schema, bool compress_states) {
  if (!compress_states) return schema;
  std::vector<Field> fields = schema.fields();
  fields[ReplayMemory::kState].shape = {0};
  Schema out;
  (void)Schema::Make(fields, &out);  // cannot fail: a valid schema with one field emptied
  return out;
}
}  // namespace

ReplayMemory::ReplayMemory(const Schema& schema, int64_t max_step, bool compress_states)
    : schema_(schema),
      max_step_(max_step),
      cols_(ColumnSchema(schema, compress_states), max_step),
      weight_(max_step),
      pos1_(max_step),
      ep_start_(max_step),
      ep_len_(max_step),
      ep_term_(max_step),
      tree_(max_step) {
  if (compress_states)
    states_ = std::make_unique<CompressedRows>(max_step, schema.field(kState).bytes());
  reward_elems_ = schema.field(kReward).num_elements();
  opt_.discount_factor.assign(reward_elems_, 0.99f);
  opt_.reward_coeff.assign(reward_elems_, 1.0f);
  opt_.cache_flags.assign(kNumCacheFlags, 1);
}

Status ReplayMemory::Make(const Schema& schema, int64_t max_step,
                          std::unique_ptr<ReplayMemory>* out, bool vector_prob,
                          bool compress_states) {
  if (schema.size() != kNumFields)
    return Error(Code::kInvalidArgument, "ReplayMemory: expected 7 fields (s,a,r,p,v,q,i), got ",
                 schema.size());
  for (int f = 0; f < kNumFields; ++f)
    if (schema.field(f).name != kFieldNames[f])
      return Error(Code::kInvalidArgument, "ReplayMemory: field ", f, " must be named '",
                   kFieldNames[f], "', got '", schema.field(f).name, "'");
  const Field& r = schema.field(kReward);
  const Field& v = schema.field(kValue);
  const Field& q = schema.field(kQvest);
  const Field& p = schema.field(kProb);
  if (r.dtype != DType::kFloat32)
    return Error(Code::kInvalidArgument, "reward_buf: expected dtype float32, got ", r.Describe());
  if (v.dtype != DType::kFloat32 || v.shape != r.shape)
    return Error(Code::kInvalidArgument, "value_buf: expected ", Field{"", DType::kFloat32, r.shape}.Describe(),
                 " (float32, the shape of reward_buf), got ", v.Describe());
  if (q.dtype != DType::kFloat32 || q.shape != r.shape)
    return Error(Code::kInvalidArgument, "qvest_buf: expected ", Field{"", DType::kFloat32, r.shape}.Describe(),
                 " (float32, the shape of reward_buf), got ", q.Describe());
  if (vector_prob) {
    if (p.dtype != DType::kFloat32 || p.shape.size() > 1)
      return Error(Code::kInvalidArgument, "prob_buf: expected float32[] or float32[n], got ",
                   p.Describe());
  } else if (p.dtype != DType::kFloat32 || !p.shape.empty()) {
    return Error(Code::kInvalidArgument, "prob_buf: expected float32[] (a scalar), got ",
                 p.Describe());
  }
  if (r.num_elements() < 1)
    return Error(Code::kInvalidArgument, "reward_buf: expected at least one element");
  if (max_step < 1)
    return Error(Code::kInvalidArgument, "max_step: expected >= 1, got ", max_step);
  std::unique_ptr<ReplayMemory> m(new ReplayMemory(schema, max_step, compress_states));
  if (!m->Allocated())
    return Error(Code::kResourceExhausted, "ReplayMemory: cannot allocate ",
                 schema.row_bytes() * max_step, " bytes for max_step=", max_step);
  *out = std::move(m);
  return Status::OK();
}

// ---------------------------------------------------------------- settings

ReplayMemory::Options ReplayMemory::options() const {
  std::shared_lock<RwLock> l(mu_);
  return opt_;
}

Status ReplayMemory::ValidateOptions(const Options& o) const {
  if (!(o.priority_exponent >= 0) || !Finite(o.priority_exponent))
    return Error(Code::kInvalidArgument, "priority_exponent: expected a finite value >= 0, got ",
                 o.priority_exponent);
  if (!(o.priority_epsilon >= 0) || !Finite(o.priority_epsilon))
    return Error(Code::kInvalidArgument, "priority_epsilon: expected a finite value >= 0, got ",
                 o.priority_epsilon);
  if (!(o.mix_lambda >= 0 && o.mix_lambda <= 1))
    return Error(Code::kInvalidArgument, "mix_lambda: expected a value in [0, 1], got ",
                 o.mix_lambda);
  if (o.frame_stack < 1 || o.frame_stack > 1024)
    return Error(Code::kInvalidArgument, "frame_stack: expected 1..1024, got ", o.frame_stack);
  if (o.multi_step < 1 || o.multi_step > 1 << 20)
    return Error(Code::kInvalidArgument, "multi_step: expected >= 1, got ", o.multi_step);
  if (o.frame_stack + o.multi_step > max_step_)
    return Error(Code::kInvalidArgument, "frame_stack + multi_step: expected <= max_step=",
                 max_step_, ", got ", o.frame_stack + o.multi_step);
  if (o.cache_size < 1)
    return Error(Code::kInvalidArgument, "cache_size: expected >= 1, got ", o.cache_size);
  if (o.max_episode < 0)
    return Error(Code::kInvalidArgument, "max_episode: expected >= 0 (0: no limit), got ",
                 o.max_episode);
  if (static_cast<int64_t>(o.discount_factor.size()) != reward_elems_)
    return Error(Code::kInvalidArgument, "discount_factor: expected ", reward_elems_,
                 " values (one per reward element), got ", o.discount_factor.size());
  for (float g : o.discount_factor)
    if (!(g >= 0 && g <= 1))
      return Error(Code::kInvalidArgument, "discount_factor: expected values in [0, 1], got ", g);
  if (static_cast<int64_t>(o.reward_coeff.size()) != reward_elems_)
    return Error(Code::kInvalidArgument, "reward_coeff: expected ", reward_elems_,
                 " values (one per reward element), got ", o.reward_coeff.size());
  for (float c : o.reward_coeff)
    if (!Finite(c)) return Error(Code::kInvalidArgument, "reward_coeff: expected finite values");
  if (static_cast<int>(o.cache_flags.size()) != kNumCacheFlags)
    return Error(Code::kInvalidArgument, "cache_flags: expected ", kNumCacheFlags,
                 " flags (prev s,a,r,p,v,q,i then next), got ", o.cache_flags.size());
  return Status::OK();
}

Status ReplayMemory::SetOptions(const Options& o) {
  MEMOIRE_RETURN_IF_ERROR(ValidateOptions(o));
  std::lock_guard<RwLock> l(mu_);
  const bool rederive = o.frame_stack != opt_.frame_stack || o.multi_step != opt_.multi_step;
  opt_ = o;
  if (rederive) RebuildTreeLocked();
  // A lower max_episode holds at once, not only from the next close_episode.
  while (opt_.max_episode > 0 && static_cast<int64_t>(episodes_.size()) > opt_.max_episode)
    EvictOldestLocked();
  return Status::OK();
}

void ReplayMemory::Seed(uint64_t seed) {
  std::lock_guard<RwLock> l(mu_);
  rng_.Seed(seed);
}

// ---------------------------------------------------------------- episodes

int64_t ReplayMemory::head_locked() const {
  if (!episodes_.empty()) return episodes_.front().start;
  return open_ ? open_start_ : tail_;
}

bool ReplayMemory::Sampleable(int64_t slot) const {
  const int64_t len = ep_len_[slot];
  if (len == 0 || pos(slot) < 0) return false;
  const int64_t k = pos(slot) - ep_start_[slot];
  return k >= opt_.frame_stack - 1 && k + opt_.multi_step <= len - 1;
}

void ReplayMemory::EvictOldestLocked() {
  const Episode ep = episodes_.front();
  episodes_.pop_front();
  std::vector<int64_t> cleared;
  for (int64_t p = ep.start; p < ep.start + ep.length; ++p) {
    const int64_t slot = p % max_step_;
    if (tree_.Get(slot) > 0) cleared.push_back(slot);
    set_pos(slot, -1);
    ep_len_[slot] = 0;
    if (states_) states_->Clear(slot);
  }
  const std::vector<double> zeros(cleared.size(), 0.0);
  tree_.SetMany(cleared.data(), zeros.data(), static_cast<int64_t>(cleared.size()));
  sampleable_ -= static_cast<int64_t>(cleared.size());
}

void ReplayMemory::RebuildTreeLocked() {
  sampleable_ = 0;
  for (int64_t slot = 0; slot < max_step_; ++slot) {
    const bool s = Sampleable(slot) && weight_[slot] > 0;
    // A leaf that stays 0 is skipped: its ancestors are already exact sums (kExactSums), and
    // an empty memory's tree then stays uncommitted (SumTree, Memory).
    if (s || tree_.Get(slot) != 0.0) tree_.Set(slot, s ? weight_[slot] : 0.0);
    sampleable_ += s;
  }
}

Status ReplayMemory::NewEpisode() {
  std::lock_guard<RwLock> l(mu_);
  if (open_) {
    for (int64_t p = open_start_; p < tail_; ++p) {
      set_pos(p % max_step_, -1);
      if (states_) states_->Clear(p % max_step_);
    }
    total_added_ -= static_cast<uint64_t>(tail_ - open_start_);
    tail_ = open_start_;
  }
  open_ = true;
  open_start_ = tail_;
  return Status::OK();
}

Status ReplayMemory::CheckCanAddLocked(int64_t n) const {
  if (!open_)
    return Error(Code::kFailedPrecondition,
                 "add_entry: no open episode (call new_episode() first)");
  if ((tail_ - open_start_) + n > max_step_)
    return Error(Code::kResourceExhausted, "add_entry: the open episode would have ",
                 (tail_ - open_start_) + n, " entries, more than max_step=", max_step_,
                 "; close episodes sooner or use a larger max_step");
  return Status::OK();
}

Status ReplayMemory::AddEntry(const void* const* fields, float init_w) {
  return AddEntries(1, fields, &init_w);
}

Status ReplayMemory::AddEntries(int64_t n, const void* const* fields, const float* init_w) {
  if (n < 0) return Error(Code::kInvalidArgument, "add_entries: expected n >= 0, got ", n);
  MEMOIRE_RETURN_IF_ERROR(CheckFinite(n, fields, init_w));
  for (int64_t k = 0; k < n; ++k)
    if (!(init_w[k] >= 0))
      return Error(Code::kInvalidArgument, "init_w: expected a finite weight >= 0, got ",
                   init_w[k]);
  // Compressed states are encoded before the lock, so samplers are not held up meanwhile
  // (states_ itself is set at construction and never replaced).
  std::vector<CompressedRows::Blob> blobs;
  if (states_)
    blobs = CompressedRows::Encode(static_cast<const uint8_t*>(fields[kState]), n,
                                   row_bytes(kState));
  std::lock_guard<RwLock> l(mu_);
  MEMOIRE_RETURN_IF_ERROR(CheckCanAddLocked(n));
  // Room for all n first (oldest episodes go; CheckCanAddLocked ensured the open one fits),
  // then each field is copied in at most two runs: up to the ring's end, then from slot 0.
  while (tail_ + n - head_locked() > max_step_) EvictOldestLocked();
  for (int64_t done = 0; done < n;) {
    const int64_t slot0 = tail_ % max_step_;
    const int64_t run = std::min(n - done, max_step_ - slot0);
    // (A compressed state's column has rows of 0 bytes: nothing is copied there.)
    for (int f = 0; f < kNumFields; ++f) {
      const size_t rb = cols_.row_bytes(f);
      uint8_t* dst = cols_.row(f, slot0);
      if (f == kQvest || fields[f] == nullptr) {
        std::memset(dst, 0, rb * run);
      } else {
        std::memcpy(dst, static_cast<const uint8_t*>(fields[f]) + done * rb, rb * run);
      }
    }
    if (states_)
      for (int64_t j = 0; j < run; ++j) states_->Put(slot0 + j, std::move(blobs[done + j]));
    std::copy(init_w + done, init_w + done + run, weight_.begin() + slot0);
    for (int64_t j = 0; j < run; ++j) set_pos(slot0 + j, tail_ + j);
    std::fill_n(ep_start_.begin() + slot0, run, open_start_);
    std::fill_n(ep_len_.begin() + slot0, run, 0);
    std::fill_n(ep_term_.begin() + slot0, run, 0);
    tail_ += run;
    done += run;
  }
  total_added_ += static_cast<uint64_t>(n);
  return Status::OK();
}

Status ReplayMemory::CheckFinite(int64_t n, const void* const* fields,
                                 const float* init_w) const {
  for (int64_t k = 0; k < n; ++k)
    if (!Finite(init_w[k]))
      return Error(Code::kInvalidArgument, "init_w: expected a finite weight >= 0, got ", init_w[k],
                   " (row ", k, ")");
  bool allow;
  {
    std::shared_lock<RwLock> l(mu_);
    allow = opt_.allow_nonfinite;
  }
  if (allow) return Status::OK();
  // r, p and v are float32 (Make checks it); rows may be unaligned (frames off the wire).
  for (int f : {kReward, kProb, kValue}) {
    if (fields[f] == nullptr) continue;
    const int64_t per_row = schema_.field(f).num_elements();
    double x = 0;
    const int64_t j = FirstNonFinite(DType::kFloat32, static_cast<const uint8_t*>(fields[f]),
                                     n * per_row, &x);
    if (j >= 0)
      return Error(Code::kInvalidArgument, kFieldNames[f], ": expected finite values, got ", x,
                   " (row ", j / per_row, "; set allow_nonfinite to store such values)");
  }
  return Status::OK();
}

Status ReplayMemory::CloseEpisode(float multiplier, bool update_value, bool update_weight,
                                  bool terminal) {
  if (!(multiplier >= 0) || !Finite(multiplier))
    return Error(Code::kInvalidArgument,
                 "episodic_weight_multiplier: expected a finite value >= 0, got ", multiplier);
  std::lock_guard<RwLock> l(mu_);
  if (!open_)
    return Error(Code::kFailedPrecondition,
                 "close_episode: no open episode (new_episode() was not called, or the episode "
                 "was already closed)");
  const int64_t L = tail_ - open_start_;
  if (L == 0)
    return Error(Code::kFailedPrecondition, "close_episode: the open episode has no entries");
  const int64_t R = reward_elems_;
  auto row = [&](int f, int64_t k) {
    return reinterpret_cast<float*>(cols_.row(f, (open_start_ + k) % max_step_));
  };
  if (update_value) {
    const double lam = opt_.mix_lambda;
    std::vector<double> next_g(R);
    for (int64_t k = L - 1; k >= 0; --k) {
      const float* r = row(kReward, k);
      const float* v = row(kValue, k);
      float* q = row(kQvest, k);
      for (int64_t d = 0; d < R; ++d) {
        double g;
        if (k == L - 1) {
          g = terminal ? r[d] : v[d];
        } else {
          const double vn = row(kValue, k + 1)[d];
          g = r[d] + opt_.discount_factor[d] * ((1.0 - lam) * vn + lam * next_g[d]);
        }
        next_g[d] = g;
        q[d] = static_cast<float>(g);
      }
    }
  }
  for (int64_t k = 0; k < L; ++k) {
    const int64_t slot = (open_start_ + k) % max_step_;
    double w = static_cast<double>(multiplier) * weight_[slot];
    if (update_weight && opt_.priority_exponent != 0.0) {
      const float* v = row(kValue, k);
      const float* q = row(kQvest, k);
      double td = 0;
      for (int64_t d = 0; d < R; ++d) td += opt_.reward_coeff[d] * (double(q[d]) - v[d]);
      w *= std::pow(std::fabs(td) + opt_.priority_epsilon, opt_.priority_exponent);
    }
    if (!Finite(w)) w = 0.0;  // an overflowing td must not poison the tree
    // Weights are stored as float32: a finite weight past its range saturates instead of
    // becoming +inf (which would make the tree's total, and every probability, meaningless).
    w = std::min(w, static_cast<double>(std::numeric_limits<float>::max()));
    weight_[slot] = static_cast<float>(w);
    ep_len_[slot] = L;
    ep_term_[slot] = terminal ? 1 : 0;
  }
  // Only the sampleable middle of the episode enters the tree, in one bulk update.
  std::vector<int64_t> slots;
  std::vector<double> weights;
  slots.reserve(L);
  weights.reserve(L);
  for (int64_t k = 0; k < L; ++k) {
    const int64_t slot = (open_start_ + k) % max_step_;
    if (Sampleable(slot) && weight_[slot] > 0) {
      slots.push_back(slot);
      weights.push_back(weight_[slot]);
    }
  }
  tree_.SetMany(slots.data(), weights.data(), static_cast<int64_t>(slots.size()));
  sampleable_ += static_cast<int64_t>(slots.size());
  episodes_.push_back({open_start_, L});
  open_ = false;
  open_start_ = tail_;
  while (opt_.max_episode > 0 && static_cast<int64_t>(episodes_.size()) > opt_.max_episode)
    EvictOldestLocked();
  return Status::OK();
}

// ---------------------------------------------------------------- counts

int64_t ReplayMemory::num_episode() const {
  std::shared_lock<RwLock> l(mu_);
  return static_cast<int64_t>(episodes_.size());
}
int64_t ReplayMemory::size() const {
  std::shared_lock<RwLock> l(mu_);
  return tail_ - head_locked();
}
int64_t ReplayMemory::num_sampleable() const {
  std::shared_lock<RwLock> l(mu_);
  return sampleable_;
}
double ReplayMemory::total_weight() const {
  std::shared_lock<RwLock> l(mu_);
  return tree_.Total();
}
bool ReplayMemory::episode_open() const {
  std::shared_lock<RwLock> l(mu_);
  return open_;
}
int64_t ReplayMemory::open_length() const {
  std::shared_lock<RwLock> l(mu_);
  return open_ ? tail_ - open_start_ : 0;
}
uint64_t ReplayMemory::total_added() const {
  std::shared_lock<RwLock> l(mu_);
  return total_added_;
}

// ---------------------------------------------------------------- sampling

Status ReplayMemory::DrawLocked(int64_t n, const SampleOut& out, int64_t* slots) {
  if (sampleable_ == 0)
    return Error(Code::kFailedPrecondition,
                 "sample: no sampleable entry (need a closed episode longer than frame_stack - 1 "
                 "+ multi_step entries with a positive weight); stored entries: ",
                 tail_ - head_locked());
  MEMOIRE_RETURN_IF_ERROR(tree_.Sample(rng_, n, /*stratified=*/true, slots));
  const int ms = opt_.multi_step;
  const double total = tree_.Total();
  for (int64_t b = 0; b < n; ++b) {
    const int64_t slot = slots[b];
    const int64_t p = pos(slot);
    if (out.weight) out.weight[b] = weight_[slot];
    if (out.prob) out.prob[b] = tree_.Get(slot) / total;
    if (out.done) out.done[b] = (p - ep_start_[slot] + ms == ep_len_[slot] - 1) && ep_term_[slot];
    if (out.id) out.id[b] = p;
  }
  return Status::OK();
}

Status ReplayMemory::Sample(int64_t n, const SampleOut& out) {
  if (n < 1) return Error(Code::kInvalidArgument, "batch_size: expected >= 1, got ", n);
  // Shared: every writer is excluded until the copy is done (no batch is torn, settings hold
  // still), while other Samples copy their batches alongside. Only the draw is one at a time.
  std::shared_lock<RwLock> l(mu_);
  if (out.frame_stack_now) *out.frame_stack_now = opt_.frame_stack;
  if (out.frame_stack != 0 && out.frame_stack != opt_.frame_stack)
    return Error(Code::kFailedPrecondition, "sample: outputs sized for frame_stack=", out.frame_stack,
                 " but frame_stack is now ", opt_.frame_stack);
  std::vector<int64_t> slots(n);
  {
    std::lock_guard<std::mutex> d(draw_mu_);
    MEMOIRE_RETURN_IF_ERROR(DrawLocked(n, out, slots.data()));
    if (out.on_draw) out.on_draw();
  }
  if (out.num_sampleable) *out.num_sampleable = sampleable_;
  if (out.total_weight) *out.total_weight = tree_.Total();
  const int fs = opt_.frame_stack;
  const int ms = opt_.multi_step;
  std::vector<int64_t> prev_slots(n * fs), next_slots(n * fs);
  for (int64_t b = 0; b < n; ++b) {
    const int64_t p = pos(slots[b]);
    for (int j = 0; j < fs; ++j) {
      prev_slots[b * fs + j] = (p - (fs - 1) + j) % max_step_;
      next_slots[b * fs + j] = (p + ms - (fs - 1) + j) % max_step_;
    }
  }
  // Writes field f's stacks of transitions [b0, b1); rows(slots, k, dst) writes k rows.
  auto stacks = [&](int f, size_t rb, int64_t b0, int64_t b1, auto&& rows) {
    const size_t stack_bytes = static_cast<size_t>(fs) * rb;
    if (out.prev[f] && out.next[f] && ms < fs) {
      // The stacks overlap: next frame j is prev frame j + ms. Copy those from the prev rows
      // just written (in cache) and read only the ms new rows from the store, transition by
      // transition, so an Atari batch reads 5 frames per transition from memory instead of 8
      // (and decodes 5 instead of 8 when compressed).
      for (int64_t b = b0; b < b1; ++b) {
        uint8_t* prev = out.prev[f] + static_cast<size_t>(b) * stack_bytes;
        uint8_t* next = out.next[f] + static_cast<size_t>(b) * stack_bytes;
        rows(&prev_slots[b * fs], fs, prev);
        std::memcpy(next, prev + ms * rb, (fs - ms) * rb);
        rows(&next_slots[b * fs + fs - ms], ms, next + (fs - ms) * rb);
      }
      return;
    }
    if (out.prev[f]) rows(&prev_slots[b0 * fs], (b1 - b0) * fs, out.prev[f] + b0 * stack_bytes);
    if (out.next[f]) rows(&next_slots[b0 * fs], (b1 - b0) * fs, out.next[f] + b0 * stack_bytes);
  };
  // Copies transitions [b0, b1) of every requested field; a decoding failure goes to *status.
  auto gather = [&](int64_t b0, int64_t b1, Status* status) {
    for (int f = 0; f < kNumFields; ++f) {
      if (f == kState && states_) {
        stacks(f, row_bytes(f), b0, b1, [&](const int64_t* s, int64_t k, uint8_t* dst) {
          if (status->ok()) *status = states_->Decode(s, k, dst);
        });
        continue;
      }
      const size_t rb = cols_.row_bytes(f);
      const uint8_t* col = cols_.data(f);
      stacks(f, rb, b0, b1, [&](const int64_t* s, int64_t k, uint8_t* dst) {
        GatherRows(col, rb, s, k, dst);
      });
    }
  };
  // A second thread copies the other half of a large batch (core/gather.h). It is the
  // memory's parked helper (waking it costs microseconds); small batches stay on this thread,
  // and so does every batch while another Sample has the helper (concurrent Samples already
  // keep several threads copying).
  size_t batch_bytes = 0;
  for (int f = 0; f < kNumFields; ++f)
    batch_bytes += ((out.prev[f] != nullptr) + (out.next[f] != nullptr)) * row_bytes(f);
  batch_bytes *= static_cast<size_t>(n) * fs;
  Status status, helper_status;
  int64_t split = n;
  std::unique_lock<std::mutex> helper(helper_mu_, std::defer_lock);
  if (batch_bytes >= kParallelCopyBytes && n >= 2 && helper.try_lock() &&
      helper_.Start([&] { gather(n / 2, n, &helper_status); }))
    split = n / 2;  // else no thread to be had: copy everything here
  gather(0, split, &status);
  if (split < n) helper_.Wait();
  return status.ok() ? helper_status : status;
}

Status ReplayMemory::UpdateWeights(int64_t n, const int64_t* ids, const float* weights,
                                   int64_t* updated) {
  for (int64_t k = 0; k < n; ++k)
    if (!(weights[k] >= 0) || !Finite(weights[k]))
      return Error(Code::kInvalidArgument, "weights: expected finite values >= 0, got ",
                   weights[k], " at ", k);
  std::lock_guard<RwLock> l(mu_);
  int64_t count = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t id = ids[k];
    if (id < 0 || id >= tail_) continue;
    const int64_t slot = id % max_step_;
    if (pos(slot) != id || !Sampleable(slot)) continue;  // evicted, open or never sampleable
    const bool was = tree_.Get(slot) > 0;
    weight_[slot] = weights[k];
    tree_.Set(slot, weights[k]);
    sampleable_ += (weights[k] > 0) - was;
    ++count;
  }
  if (updated) *updated = count;
  return Status::OK();
}

size_t ReplayMemory::memory_bytes() const {
  std::shared_lock<RwLock> l(mu_);
  return cols_.allocated_bytes() +
         static_cast<size_t>(max_step_) * (sizeof(float) + 3 * sizeof(int64_t) + 1) +
         static_cast<size_t>(2 * max_step_) * sizeof(double) +
         (states_ ? states_->index_bytes() + states_->stored_bytes() : 0);
}

size_t ReplayMemory::stored_state_bytes() const {
  std::shared_lock<RwLock> l(mu_);
  if (states_) return states_->stored_bytes();
  return static_cast<size_t>(tail_ - head_locked()) * row_bytes(kState);
}

std::string ReplayMemory::Info() const {
  std::shared_lock<RwLock> l(mu_);
  std::ostringstream os;
  os << "ReplayMemory(uuid=" << std::hex << uuid_ << std::dec << ", max_step=" << max_step_
     << ")\n";
  for (const Field& f : schema_.fields()) os << "  " << f.name << ": " << f.Describe() << "\n";
  os << "  entry_size=" << schema_.row_bytes() << " bytes, episodes=" << episodes_.size()
     << ", stored=" << (tail_ - head_locked()) << ", sampleable=" << sampleable_
     << ", open=" << (open_ ? tail_ - open_start_ : 0) << "\n";
  os << "  frame_stack=" << opt_.frame_stack << ", multi_step=" << opt_.multi_step
     << ", priority_exponent=" << opt_.priority_exponent << ", mix_lambda=" << opt_.mix_lambda
     << ", cache_size=" << opt_.cache_size << ", max_episode=" << opt_.max_episode
     << ", reuse_cache=" << opt_.reuse_cache << ", compress_states=" << (states_ != nullptr);
  return os.str();
}

}  // namespace memoire
