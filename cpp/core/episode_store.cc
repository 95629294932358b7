#include "core/episode_store.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "core/circular_buffer.h"
#include "core/protocol.h"
#include "core/replay_memory.h"
#include "core/transition_store.h"

namespace memoire {

namespace {

std::vector<int64_t> Rows(const std::vector<int64_t>& row_shape) {
  std::vector<int64_t> shape{-1};
  shape.insert(shape.end(), row_shape.begin(), row_shape.end());
  return shape;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];  // shape[0] is the row count
  return n;
}

// kInvalidArgument naming the column and row of the first NaN or infinity in `parts`' column c.
Status CheckColumnFinite(const std::vector<EpisodeStore::Part>& parts,
                         const codec::ArraySpec& spec, size_t c) {
  const int64_t per_row = Elements(spec.shape);
  int64_t row0 = 0;
  for (const EpisodeStore::Part& p : parts) {
    double bad = 0;
    const int64_t j = FirstNonFinite(spec.dtype, static_cast<const uint8_t*>(p.columns[c]),
                                     p.rows * per_row, &bad);
    if (j >= 0)
      return Error(Code::kInvalidArgument, spec.name, ": expected finite values, got ", bad,
                   " (row ", row0 + j / per_row, ")");
    row0 += p.rows;
  }
  return Status::OK();
}

// The index of the last part with rows (the one whose last row ends the episode); parts may be
// empty (an episode's last chunk often is).
size_t LastNonEmpty(const std::vector<EpisodeStore::Part>& parts) {
  size_t last = 0;
  for (size_t k = 0; k < parts.size(); ++k)
    if (parts[k].rows > 0) last = k;
  return last;
}

// Copies a column of unaligned bytes into aligned values.
template <typename T>
std::vector<T> Aligned(const void* p, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  if (n > 0) std::memcpy(v.data(), p, static_cast<size_t>(n) * sizeof(T));
  return v;
}

// ---- memoire's episodic memory

class MemoryEpisodeStore : public EpisodeStore {
 public:
  explicit MemoryEpisodeStore(std::shared_ptr<ReplayMemory> memory) : memory_(std::move(memory)) {
    const Schema& schema = memory_->schema();
    for (int f = 0; f < ReplayMemory::kNumFields; ++f) {
      column_of_[f] = -1;
      if (f == ReplayMemory::kQvest) continue;  // computed at close, not sent
      column_of_[f] = static_cast<int>(row_spec_.size());
      row_spec_.push_back({schema.field(f).name, schema.field(f).dtype,
                           Rows(schema.field(f).shape), false});
    }
    init_w_ = static_cast<int>(row_spec_.size());
    const protocol::Column& init_w = protocol::kMemoryInitW;
    row_spec_.push_back({init_w.name, init_w.dtype, {-1}, false});
  }

  int64_t max_episode_rows() const override { return memory_->max_step(); }

  Status Check(const std::vector<Part>& parts, const End& end, bool* nonfinite) const override {
    *nonfinite = true;
    if (!std::isfinite(end.multiplier))
      return Error(Code::kInvalidArgument,
                   "episodic_weight_multiplier: expected a finite value >= 0, got ", end.multiplier);
    for (const Part& p : parts) {
      const void* fields[ReplayMemory::kNumFields];
      Fields(p, fields);
      MEMOIRE_RETURN_IF_ERROR(
          memory_->CheckFinite(p.rows, fields, Aligned<float>(p.columns[init_w_], p.rows).data()));
    }
    *nonfinite = false;
    if (!(end.multiplier >= 0))
      return Error(Code::kInvalidArgument,
                   "episodic_weight_multiplier: expected a finite value >= 0, got ", end.multiplier);
    for (const Part& p : parts)
      for (float w : Aligned<float>(p.columns[init_w_], p.rows))
        if (!(w >= 0))
          return Error(Code::kInvalidArgument, "init_w: expected a finite weight >= 0, got ", w);
    return Status::OK();
  }

  Status Commit(const std::vector<Part>& parts, const End& end) override {
    Status s = memory_->NewEpisode();
    for (size_t k = 0; s.ok() && k < parts.size(); ++k) {
      const void* fields[ReplayMemory::kNumFields];
      Fields(parts[k], fields);
      s = memory_->AddEntries(parts[k].rows, fields,
                              Aligned<float>(parts[k].columns[init_w_], parts[k].rows).data());
    }
    if (s.ok()) s = memory_->CloseEpisode(end.multiplier, end.update_value, end.update_weight,
                                          end.terminal);
    if (!s.ok()) memory_->NewEpisode();  // discards the partial episode
    return s;
  }

 private:
  void Fields(const Part& p, const void** fields) const {
    for (int f = 0; f < ReplayMemory::kNumFields; ++f)
      fields[f] = column_of_[f] < 0 ? nullptr : p.columns[column_of_[f]];
  }

  const std::shared_ptr<ReplayMemory> memory_;
  int column_of_[ReplayMemory::kNumFields];
  int init_w_ = 0;
};

// ---- Dopamine's TF circular and prioritized buffers

class CircularEpisodeStore : public EpisodeStore {
 public:
  CircularEpisodeStore(std::shared_ptr<CircularBuffer> buffer, bool allow_nonfinite)
      : buffer_(std::move(buffer)), allow_nonfinite_(allow_nonfinite) {
    for (const Field& f : buffer_->schema().fields())
      row_spec_.push_back({f.name, f.dtype, Rows(f.shape), false});
  }

  Status Check(const std::vector<Part>& parts, const End&, bool* nonfinite) const override {
    *nonfinite = true;
    if (allow_nonfinite_) return Status::OK();
    return CheckColumnFinite(parts, row_spec_[CircularBuffer::kReward], CircularBuffer::kReward);
  }

  Status Commit(const std::vector<Part>& parts, const End&) override {
    const bool prioritized = buffer_->options().prioritized;
    // Dopamine's add without a priority gives the largest recorded one; such adds never raise
    // it, so one value serves the whole episode.
    const double priority = prioritized ? buffer_->max_recorded_priority() : 0.0;
    const size_t last = LastNonEmpty(parts);
    for (size_t k = 0; k < parts.size(); ++k) {
      const Part& p = parts[k];
      if (p.rows == 0) continue;
      std::vector<uint8_t> ends(static_cast<size_t>(p.rows), 0);
      if (k == last) ends.back() = 1;
      std::vector<double> priorities(prioritized ? static_cast<size_t>(p.rows) : 0, priority);
      MEMOIRE_RETURN_IF_ERROR(buffer_->AddBatch(p.rows, p.columns.data(), ends.data(),
                                                prioritized ? priorities.data() : nullptr));
    }
    return Status::OK();
  }

 private:
  const std::shared_ptr<CircularBuffer> buffer_;
  const bool allow_nonfinite_;
};

}  // namespace

std::unique_ptr<EpisodeStore> EpisodeStoreOf(std::shared_ptr<ReplayMemory> memory) {
  return std::unique_ptr<EpisodeStore>(new MemoryEpisodeStore(std::move(memory)));
}

std::unique_ptr<EpisodeStore> EpisodeStoreOf(std::shared_ptr<CircularBuffer> buffer,
                                             bool allow_nonfinite) {
  return std::unique_ptr<EpisodeStore>(new CircularEpisodeStore(std::move(buffer),
                                                                allow_nonfinite));
}

// ---- Dopamine's JAX buffer

namespace {
constexpr size_t kReward = 2, kTerminal = 3;
}  // namespace

TransitionEpisodeStore::TransitionEpisodeStore(std::shared_ptr<TransitionStore> store,
                                               bool allow_nonfinite)
    : store_(std::move(store)), allow_nonfinite_(allow_nonfinite) {}

Status TransitionEpisodeStore::Make(std::shared_ptr<TransitionStore> store,
                                    DType observation_dtype,
                                    const std::vector<int64_t>& observation_shape,
                                    DType action_dtype, const std::vector<int64_t>& action_shape,
                                    bool allow_nonfinite,
                                    std::unique_ptr<TransitionEpisodeStore>* out) {
  if (!store) return Error(Code::kInvalidArgument, "TransitionEpisodeStore: expected a store");
  std::unique_ptr<TransitionEpisodeStore> s(
      new TransitionEpisodeStore(std::move(store), allow_nonfinite));
  s->row_spec_ = {{"observation", observation_dtype, Rows(observation_shape), false},
                  {"action", action_dtype, Rows(action_shape), false},
                  {"reward", DType::kFloat64, {-1}, false},
                  {"terminal", DType::kBool, {-1}, false}};
  const TransitionStore::Options& o = s->store_->options();
  const int64_t frame = Elements(s->row_spec_[0].shape) * ItemSize(observation_dtype);
  const int64_t action = Elements(s->row_spec_[1].shape) * ItemSize(action_dtype);
  for (int64_t d : observation_shape)
    if (d < 0) return Error(Code::kInvalidArgument, "observation_shape: expected sizes >= 0");
  for (int64_t d : action_shape)
    if (d < 0) return Error(Code::kInvalidArgument, "action_shape: expected sizes >= 0");
  if (frame != static_cast<int64_t>(o.frame_bytes) || ItemSize(observation_dtype) != o.elem_bytes)
    return Error(Code::kInvalidArgument, "observation: expected ", o.frame_bytes,
                 " bytes of ", o.elem_bytes, "-byte elements, got ", frame, " bytes of ",
                 ItemSize(observation_dtype));
  if (action != static_cast<int64_t>(o.action_bytes))
    return Error(Code::kInvalidArgument, "action: expected ", o.action_bytes, " bytes, got ",
                 action);
  *out = std::move(s);
  return Status::OK();
}

Status TransitionEpisodeStore::set_priority(double value) {
  if (!(value >= 0) || !std::isfinite(value))
    return Error(Code::kInvalidArgument, "priority: expected a finite value >= 0, got ", value);
  priority_.store(value);
  return Status::OK();
}

Status TransitionEpisodeStore::Check(const std::vector<Part>& parts, const End&,
                                     bool* nonfinite) const {
  *nonfinite = true;
  if (allow_nonfinite_) return Status::OK();
  return CheckColumnFinite(parts, row_spec_[kReward], kReward);
}

Status TransitionEpisodeStore::Commit(const std::vector<Part>& parts, const End&) {
  const bool prioritized = store_->options().prioritized;
  const double priority = priority_.load();
  const size_t last = LastNonEmpty(parts);
  for (size_t k = 0; k < parts.size(); ++k) {
    const Part& p = parts[k];
    if (p.rows == 0) continue;
    const std::vector<double> rewards = Aligned<double>(p.columns[kReward], p.rows);
    std::vector<uint8_t> ends(static_cast<size_t>(p.rows), 0);
    if (k == last) ends.back() = 1;
    std::vector<double> priorities(prioritized ? static_cast<size_t>(p.rows) : 0, priority);
    std::vector<int64_t> emitted(static_cast<size_t>(p.rows));
    MEMOIRE_RETURN_IF_ERROR(store_->AddBatch(
        p.rows, static_cast<const uint8_t*>(p.columns[0]),
        static_cast<const uint8_t*>(p.columns[1]), rewards.data(),
        static_cast<const uint8_t*>(p.columns[kTerminal]), ends.data(),
        prioritized ? priorities.data() : nullptr, emitted.data()));
  }
  return Status::OK();
}

}  // namespace memoire
