// CircularBuffer: the storage and sampling behind Dopamine's TF-era replay buffers
// (dopamine/tf/replay_memory/circular_replay_buffer.py and prioritized_replay_buffer.py,
// dopamine-rl 4.1.2), bit for bit: the same slots, validity rules, n-step sums and outputs.
//
// Model. A ring of `capacity` slots over Columns. Schema fields are, in this order:
// observation, action, reward, terminal, then the caller's extras. add_count counts every slot
// written, the stack_size - 1 zero "padding" slots written before each episode's first step
// included; the cursor is add_count % capacity. Per slot we keep an episode-end flag (Dopamine's
// episode_end_indices). With `prioritized`, a SumTree holds one priority per slot (padding
// slots get 0) and the tree's max_recorded is Dopamine's sum_tree.max_recorded_priority.
//
// Quirks kept on purpose (each matches Dopamine; tests compare against it):
//  - a leaf is set as old + (new - old), as Dopamine's delta update does;
//  - n-step reward sums use numpy's float32/float64 summation order (pairwise over 8 lanes for
//    8 or more terms) and numpy's type promotion, so sums agree to the bit;
//  - Gather makes the checks of Dopamine's get_range, in its order: an index outside the ring
//    is kOutOfRange (details index, bound), a slot not yet written kNotFound (detail key), and a
//    vector reward numpy would not broadcast kInvalidArgument (detail length). Dopamine's
//    wording (its AssertionErrors, numpy's texts) is memoire.dopamine_compat's.
// Option `episode_end_breaks_stacks` fixes google/dopamine#213 (a stack may cross an episode
// that ended by truncation); it is off by default, as in Dopamine.
//
// Cost: Add O(row bytes) (+ O(log n) prioritized); IsValid O(stack + horizon); Gather
// O(batch * (stack * observation bytes + horizon)); prioritized sampling O(batch log n).
// Thread-safety: thread-safe; every public method takes the buffer's mutex. column() hands out
// raw storage for read-only views: reading it while another thread adds is a data race.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/columns.h"
#include "core/reserved.h"
#include "core/rng.h"
#include "core/schema.h"
#include "core/status.h"
#include "core/sum_tree.h"

namespace memoire {

class CircularBuffer {
 public:
  enum FieldIndex { kObservation = 0, kAction = 1, kReward = 2, kTerminal = 3, kFirstExtra = 4 };

  struct Options {
    int64_t capacity = 0;
    int stack_size = 1;
    int update_horizon = 1;
    double gamma = 0.99;
    int64_t max_sample_attempts = 1000;
    bool prioritized = false;
    bool episode_end_breaks_stacks = false;  // fix for google/dopamine#213
    uint64_t seed = 0;
  };

  // Where Gather writes one batch of n transitions. All pointers are caller-owned, C-contiguous:
  // state/next_state [n, *obs_shape, stack], action/next_action [n, *action_shape],
  // reward/next_reward [n, *reward_shape], terminal [n] (terminal dtype), indices int32[n],
  // extras[e] [n, *extra_shape], probabilities float32[n] (prioritized only; may be null).
  struct Outputs {
    uint8_t* state = nullptr;
    uint8_t* action = nullptr;
    uint8_t* reward = nullptr;
    uint8_t* next_state = nullptr;
    uint8_t* next_action = nullptr;
    uint8_t* next_reward = nullptr;
    uint8_t* terminal = nullptr;
    int32_t* indices = nullptr;
    std::vector<uint8_t*> extras;
    float* probabilities = nullptr;
  };

  // Fails when capacity < stack_size + update_horizon, stack_size or
  // update_horizon < 1, the schema lacks the four leading fields, terminal is not a scalar, the
  // reward dtype is float16, or memory cannot be allocated.
  static Status Make(const Schema& schema, const Options& options,
                     std::unique_ptr<CircularBuffer>* out);

  const Schema& schema() const { return columns_.schema(); }
  const Options& options() const { return options_; }
  int64_t capacity() const { return options_.capacity; }

  // Dopamine's add(): pads with stack_size - 1 zero slots when an episode starts, records
  // `episode_end` (terminal or truncation) at the cursor, writes `rows[f]` (one row per schema
  // field, already of the field's dtype and shape) and, when prioritized, the priority (finite,
  // >= 0). A failed call changes nothing.
  Status Add(const void* const* rows, bool episode_end, double priority);
  // k adds at once, as k calls to Add: columns[f] holds k rows of field f; episode_end[k];
  // priorities[k] (required when prioritized, else ignored and may be null).
  Status AddBatch(int64_t k, const void* const* columns, const uint8_t* episode_end,
                  const double* priorities);

  // add_count never exceeds kMaxAddCount (2**62), whatever sets it (set_add_count, Restore, or
  // adds, which fail with kResourceExhausted rather than pass it), so add_count + a batch's
  // slots cannot overflow int64 and the cursor is never negative. No real run gets near it.
  static constexpr int64_t kMaxAddCount = int64_t{1} << 62;
  int64_t add_count() const;
  // Sets the counter alone (Dopamine allows assigning add_count); 0 <= count <= kMaxAddCount.
  Status set_add_count(int64_t count);
  bool next_is_episode_start() const;
  void set_next_is_episode_start(bool v);

  // Dopamine's is_valid_transition for one index, and for n of them into out[n] (0/1).
  bool IsValid(int64_t index) const;
  void IsValidMany(const int64_t* indices, int64_t n, uint8_t* out) const;

  // Dopamine's sample_index_batch: uniform rejection sampling, or (prioritized) stratified
  // sampling with non-stratified redraws of invalid indices. kFailedPrecondition when fewer
  // slots than stack_size + update_horizon are written (detail "needed"), when the attempts run
  // out (detail "sampled": valid indices drawn), or when every priority is 0 (no details).
  Status SampleIndices(int64_t n, int64_t* out);
  // Dopamine's sample_transition_batch body for the given indices (any int64, checked as
  // Dopamine's get_range does; see the header comment for the errors).
  Status Gather(const int64_t* indices, int64_t n, const Outputs& out) const;
  // SampleIndices then Gather under one lock; the indices land in indices_out[n].
  Status SampleAndGather(int64_t n, const Outputs& out, int64_t* indices_out);

  // Priorities (prioritized only). Set: indices in [0, capacity), priorities finite >= 0; all
  // are checked before any is set. Get: indices in [-P, P) where P is the padded leaf count
  // (numpy's indexing of Dopamine's leaf array), values 0 past capacity. A bad index is
  // kOutOfRange with details index and bound (capacity, resp. P).
  Status SetPriorities(const int64_t* indices, const double* priorities, int64_t n);
  Status GetPriorities(const int64_t* indices, int64_t n, double* out) const;
  double max_recorded_priority() const;
  void set_max_recorded_priority(double v);
  double total_priority() const;
  int64_t padded_leaves() const { return padded_leaves_; }
  // Non-stratified (n draws) or stratified samples straight from the tree, no validity check;
  // kFailedPrecondition when every priority is 0.
  Status SampleTree(int64_t n, bool stratified, int64_t* out);

  // Slots flagged as episode ends, ascending; and replacing them all (slots in [0, capacity)).
  std::vector<int64_t> EpisodeEnds() const;
  Status SetEpisodeEnds(const std::vector<int64_t>& slots);

  // Replaces the whole state at once (checkpoint load): columns[f] holds capacity rows of field
  // f; leaves[capacity] the priorities (prioritized only, finite >= 0). Checks, then commits.
  Status Restore(const void* const* columns, int64_t add_count, const std::vector<int64_t>& ends,
                 const double* leaves, double max_recorded);
  // The same, taking the columns of `staging` (a buffer of the same schema and capacity whose
  // columns the caller filled, e.g. streamed from a checkpoint): its pages move here without a
  // second resident copy (see Columns::TakeContents) and it is left empty. kInvalidArgument
  // when the schemas or capacities differ.
  Status RestoreFrom(CircularBuffer* staging, int64_t add_count, const std::vector<int64_t>& ends,
                     const double* leaves, double max_recorded);

  void Seed(uint64_t seed);
  // Raw storage of field f (capacity rows), for read-only numpy views.
  uint8_t* column(int f) { return columns_.data(f); }

 private:
  CircularBuffer(Columns columns, const Options& options);
  bool full() const { return add_count_ >= options_.capacity; }
  int64_t cursor() const { return add_count_ % options_.capacity; }
  int64_t Mod(int64_t x) const {
    int64_t r = x % options_.capacity;
    return r < 0 ? r + options_.capacity : r;
  }
  bool Terminal(int64_t slot) const;
  bool IsValidLocked(int64_t index) const;
  void SetLeaf(int64_t slot, double priority);
  void WriteRow(const void* const* rows, int64_t row_index, bool episode_end, double priority);
  Status SampleLocked(int64_t n, int64_t* out);
  Status GatherLocked(const int64_t* indices, int64_t n, const Outputs& out) const;
  Status CheckPriority(double p) const;
  // OK when `k` more adds (each up to stack_size slots, padding included) keep add_count_ within
  // kMaxAddCount; mu_ held.
  Status CheckRoomLocked(int64_t k) const;
  Status CheckRestore(int64_t add_count, const std::vector<int64_t>& ends, const double* leaves,
                      double max_recorded) const;
  void RestoreStateLocked(int64_t add_count, const std::vector<int64_t>& ends,
                          const double* leaves, double max_recorded);

  mutable std::mutex mu_;
  Options options_;
  Columns columns_;                    // guarded by mu_
  ReservedArray<uint8_t> episode_end_;  // guarded by mu_; capacity flags, committed as written
  int64_t add_count_ = 0;              // guarded by mu_
  bool next_is_episode_start_ = true;  // guarded by mu_
  SumTree tree_;                       // guarded by mu_
  Rng rng_;                            // guarded by mu_
  int64_t padded_leaves_ = 1;
  std::vector<float> discount_;        // gamma^k as float32, k < update_horizon
  std::vector<uint8_t> zero_row_;      // largest row of zeros, for padding
  uint8_t terminal_one_[8] = {};       // 1 in the terminal dtype
};

}  // namespace memoire
