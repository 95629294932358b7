// TransitionStore: the storage behind memoire's drop-in for Dopamine's JAX ReplayBuffer
// (dopamine/jax/replay_memory: TransitionAccumulator + ReplayBuffer + Uniform/Prioritized
// SamplingDistribution + SumTree), reproducing what an agent observes bit for bit while storing
// each frame once.
//
// Model.
// - Steps (frame, action, reward, terminal, episode_end) enter an accumulator: a window of the
//   last update_horizon + stack_size steps of the current trajectory, cleared at a terminal or an
//   episode end, exactly as Dopamine's TransitionAccumulator (quirks included: with horizon n the
//   terminal step's own reward is left out of the n-step element; with stacks the terminal loop
//   repeats the same transition with more and more zero frames, google/dopamine#228).
//   `fix_terminal_duplicates` emits each terminal transition once, with its full stack.
// - Frames go to a frame ring (reserved memory, reserved.h: pages are committed as frames
//   arrive), one copy per step, addressed by a monotone position (slot =
//   position % frame capacity). Frames of a trajectory that never yields an element are taken
//   back when it is cleared. An element references its state and next-state stacks as
//   (end position, number of real frames); missing frames read as zeros. The ring grows (copying
//   the live span) when the live span would not fit, which only pathological streams cause.
// - Elements are keyed like Dopamine (key = add_count at insertion) and live in a ring of
//   max_capacity records; the oldest is evicted after an add overflows, as Dopamine does.
// - The sampler mirrors Dopamine's key <-> dense-index maps (swap-with-last removal) so the same
//   random draws pick the same keys; the prioritized tree is the shared SumTree with Dopamine
//   JAX's update rule (SumTree::Rule::kAddDeltas), so probabilities and nodes match exactly.
//   Random numbers are drawn by the caller (memoire's Python face uses the numpy Generator that
//   Dopamine's sampler would use) and passed in as indices or targets.
//
// Cost: Add O(frame bytes + stack + horizon [+ log n prioritized]); Gather O(n * 2 * stack *
// frame bytes), memcpy-bound; Update O(k log k + k log n).
// Thread-safety: thread-safe. Reads (draws, gathers, exports, counts) share mu_, so several
// feed threads draw and copy their batches at once; writers (adds, priority updates, clears,
// imports) hold it alone, and a waiting writer goes before new reads (core/rw_lock.h). So a
// priority update lands between two of a thread's batches, never inside one. A failed call
// changes nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/reserved.h"
#include "core/rng.h"
#include "core/rw_lock.h"
#include "core/status.h"
#include "core/sum_tree.h"

namespace memoire {

class TransitionStore {
 public:
  struct Options {
    int64_t max_capacity = 0;   // elements kept (Dopamine's ReplayBuffer.max_capacity)
    int stack_size = 1;
    int update_horizon = 1;
    double gamma = 0.99;
    bool fix_terminal_duplicates = false;  // see the header comment
    bool prioritized = false;
    int64_t tree_capacity = 0;  // PrioritizedSamplingDistribution.max_capacity (leaves)
    size_t frame_bytes = 0;     // bytes of one observation
    size_t elem_bytes = 1;      // bytes of one observation element (for channel-last gather)
    size_t action_bytes = 0;    // bytes of one action
  };

  // Fails with kInvalidArgument on a non-positive capacity, stack or horizon, or frame size 0.
  static Status Make(const Options& o, std::unique_ptr<TransitionStore>* out);

  const Options& options() const { return opt_; }

  // Adds one step; `priority` is the leaf value (already raised to the exponent) given to every
  // element this step yields. Sets *emitted to the number of elements yielded.
  Status Add(const uint8_t* frame, const uint8_t* action, double reward, bool terminal,
             bool episode_end, double priority, int64_t* emitted);
  // Adds k consecutive steps under one lock, exactly as k Add calls in order: step b is
  // frames[b * frame_bytes ...], actions[b * action_bytes ...], rewards[b], terminals[b],
  // episode_ends[b] (bytes, nonzero = true) and priorities[b] (null: 0 for every step, allowed
  // only when not prioritized). Sets emitted[b] to the elements step b yielded. Every priority is
  // checked before anything is added (kInvalidArgument naming the step), so a failed call
  // changes nothing.
  Status AddBatch(int64_t k, const uint8_t* frames, const uint8_t* actions,
                  const double* rewards, const uint8_t* terminals, const uint8_t* episode_ends,
                  const double* priorities, int64_t* emitted);

  // add_count (the next key) never exceeds kMaxAddCount = 2**31, so every key fits the int32
  // keys that Dopamine's samplers hand out: Import refuses more and adds that would pass it fail
  // with kResourceExhausted (changing nothing). No real run gets near it.
  static constexpr int64_t kMaxAddCount = int64_t{1} << 31;
  int64_t add_count() const;
  int64_t size() const;  // live elements (== sampler size)
  double tree_root() const;
  int64_t tree_leaves() const { return opt_.prioritized ? tree_.padded_leaves() : 0; }

  // keys[b] = key at dense index indices[b] (uniform draws); kOutOfRange (details index,
  // bound = size()) on a bad index.
  Status KeysAt(const int64_t* indices, int64_t n, int32_t* keys) const;
  // Prioritized draw: descends Dopamine's tree for each target; writes keys and
  // probabilities (leaf / root). kFailedPrecondition when the tree is empty.
  Status Query(const double* targets, int64_t n, int32_t* keys, double* probabilities) const;
  // Sets the leaf values of `keys` (Dopamine's update after the exponent). kNotFound (detail
  // "key") when a key is not stored; kInvalidArgument on a negative or NaN value.
  Status Update(const int64_t* keys, const double* values, int64_t n);
  // Leaf values of `keys` (1 each when not prioritized); kNotFound as Update.
  Status Priorities(const int64_t* keys, int64_t n, double* out) const;

  // Assembles elements of `keys` into caller arrays: state/next_state [n, *obs, stack]
  // channel-last, action [n, action_bytes], reward f64[n], terminal/episode_end bool[n].
  // kNotFound (detail "key") when a key is not stored.
  Status Gather(const int64_t* keys, int64_t n, uint8_t* state, uint8_t* action, double* reward,
                uint8_t* next_state, uint8_t* terminal, uint8_t* episode_end) const;

  // The prefetching feed's draw (core/prefetch.h): draws n elements and gathers them under one
  // shared hold of the lock (other threads draw and gather at the same time), so a priority
  // update lands between two batches, never inside one. Uniform over the
  // stored elements (dense index rng->Below(size())), or, when prioritized with a positive
  // total, by targets rng->Uniform() * total descended as Query does; probabilities[b] is the
  // element's probability (1 / size() when drawn uniformly, as the JAX face's fallback).
  // keys int32[n], probabilities f64[n], the rest as Gather. kFailedPrecondition when nothing
  // is stored; kOutOfRange as Query. The draws come from `rng`, not from the numpy Generator
  // the JAX face shares with Dopamine, so the stream differs from the face's sample().
  Status SampleGather(Rng* rng, int64_t n, int32_t* keys, double* probabilities, uint8_t* state,
                      uint8_t* action, double* reward, uint8_t* next_state, uint8_t* terminal,
                      uint8_t* episode_end) const;

  // The feed's draw for stacking on the device (memoire.feed, stack_on_device=True): the same
  // draws as SampleGather for the same generator state, but the stacks are not assembled here.
  // Each distinct frame the batch's stacks read travels once, with where each stack frame
  // comes from:
  //   frames  [padded, frame_bytes]: the distinct frames in ascending ring order (the zero
  //           frame that stands before an episode's first frame counts as one), then zeros up
  //           to padded = distinct rounded up to a multiple of `granule` (>= 1), so that a
  //           device function sees few shapes. The caller's block holds
  //           DistinctFramesCapacity(n, stack, granule) frames.
  //   index   int32[n, 2, stack]: state[b, ..., k] = frames[index[b, 0, k]] and
  //           next_state[b, ..., k] = frames[index[b, 1, k]] (SampleGather's stacks exactly).
  //   counts  int32[2]: {distinct, padded}; distinct <= 2 * n * stack.
  // keys, probabilities, action, reward, terminal, episode_end and the errors as SampleGather.
  Status SampleDistinctFrames(Rng* rng, int64_t n, int64_t granule, int32_t* keys,
                              double* probabilities, uint8_t* frames, int32_t* index,
                              int32_t* counts, uint8_t* action, double* reward,
                              uint8_t* terminal, uint8_t* episode_end) const;
  static int64_t DistinctFramesCapacity(int64_t n, int stack, int64_t granule) {
    return (2 * n * stack + granule - 1) / granule * granule;
  }

  void Clear();
  // Drops the accumulator's partial trajectory (Dopamine's TransitionAccumulator.clear).
  void ClearTrajectory();

  // ---- checkpoint pieces (Dopamine's state dict layout is built in Python) ----
  // The dense index -> key map (size() entries) and the tree nodes (num_nodes(), root first).
  void ExportSampler(int64_t* key_by_index, double* nodes) const;
  int64_t num_nodes() const { return opt_.prioritized ? tree_.heap_size() : 0; }
  // Accumulator window: its length, then its steps.
  int64_t window_size() const;
  void ExportWindow(uint8_t* frames, uint8_t* actions, double* rewards, uint8_t* terminals,
                    uint8_t* episode_ends) const;
  // Replaces everything. Elements are keys [add_count - m, add_count) with full stacks
  // ([m, *obs, stack] channel-last); frames shared between stacks are stored once when found
  // among the most recent frames. key_by_index (m entries) must be a permutation of the keys;
  // nodes has num_nodes() entries (or is null when not prioritized). The window holds w steps.
  Status Import(int64_t add_count, int64_t m, const uint8_t* states, const uint8_t* actions,
                const double* rewards, const uint8_t* next_states, const uint8_t* terminals,
                const uint8_t* episode_ends, const int64_t* key_by_index, const double* nodes,
                int64_t w, const uint8_t* win_frames, const uint8_t* win_actions,
                const double* win_rewards, const uint8_t* win_terminals,
                const uint8_t* win_episode_ends);

  // Frames held by the ring (for tests and memory accounting).
  int64_t frame_capacity() const;

 private:
  explicit TransitionStore(const Options& o);

  struct Step {  // one accumulator entry
    int64_t pos;  // frame position
    double reward;
    bool terminal, episode_end;
  };

  // All below: mu_ held (shared by the const ones).
  // OK when `k` more steps (each yields at most update_horizon + stack_size elements) keep
  // add_count_ within kMaxAddCount.
  Status CheckRoomLocked(int64_t k) const;
  int64_t AddLocked(const uint8_t* frame, const uint8_t* action, double reward, bool terminal,
                    bool episode_end, double priority);  // returns elements yielded
  uint8_t* frame_at(int64_t pos) { return frames_.data() + (pos % frame_cap_) * opt_.frame_bytes; }
  const uint8_t* frame_at(int64_t pos) const {
    return frames_.data() + (pos % frame_cap_) * opt_.frame_bytes;
  }
  int64_t OldestNeededPos() const;
  void EnsureRoom(int64_t extra);  // room for `extra` more frames at head_
  int64_t PushFrame(const uint8_t* frame);
  // Emits the element with state end at window offset `i`, next end at offset `j`, frames
  // valid from window offset `first`; reward over [i, min(i + n - 1, last)].
  void Emit(int i, int j, int first, bool terminal, double priority);
  void ClearWindow();
  int64_t DenseIndexOf(int64_t key) const { return index_of_[key % (opt_.max_capacity + 1)]; }
  bool Live(int64_t key) const { return key >= add_count_ - size_ && key < add_count_; }
  int64_t StackSlot(int64_t end, int valid, int k) const;
  // n draws as SampleGather describes: keys and probabilities; size_ > 0.
  Status DrawLocked(Rng* rng, int64_t n, int64_t* keys, double* probabilities) const;
  // Ring slots of the stacks of `keys` (ss, ns: [n, stack], frame_cap_ for the zero frame)
  // and their other fields; every key live.
  void FieldsLocked(const int64_t* keys, int64_t n, int64_t* ss, int64_t* ns, uint8_t* action,
                    double* reward, uint8_t* terminal, uint8_t* episode_end) const;
  // Gather's copies; every key live.
  void GatherLocked(const int64_t* keys, int64_t n, uint8_t* state, uint8_t* action,
                    double* reward, uint8_t* next_state, uint8_t* terminal,
                    uint8_t* episode_end) const;

  Options opt_;
  mutable RwLock mu_;

  // Frame ring (+ one zero frame at index frame_cap_), reserved: pages are committed as
  // frames are written, and the zero frame reads as zeros untouched.
  static ReservedBytes AllocFrames(int64_t cap, size_t frame_bytes);
  ReservedBytes frames_;
  int64_t frame_cap_ = 0;
  int64_t head_ = 0;  // next frame position

  // Accumulator window: steps w_[0..w_len_) in order; actions alongside.
  std::vector<Step> w_;
  std::vector<uint8_t> w_actions_;
  int w_len_ = 0;
  int64_t w_start_pos_ = -1;  // frame position of the first step since the last clear
  bool w_emitted_ = false;    // whether this trajectory yielded an element

  // Elements, slot = key % max_capacity. Sized by max_capacity but reserved (reserved.h):
  // only slots that were written take memory.
  ReservedArray<int64_t> e_state_end_, e_next_end_;
  ReservedArray<uint8_t> e_state_valid_, e_next_valid_;
  ReservedArray<double> e_reward_;
  ReservedArray<uint8_t> e_terminal_, e_episode_end_;
  ReservedArray<uint8_t> e_action_;
  int64_t add_count_ = 0;
  int64_t size_ = 0;

  // Sampler maps (reserved likewise).
  ReservedArray<int64_t> key_by_index_;  // dense index -> key
  ReservedArray<int64_t> index_of_;      // key % (max_capacity + 1) -> dense index
  bool Allocated() const;

  // Priorities by dense index (prioritized only; else an unused one-leaf tree).
  SumTree tree_;
};

}  // namespace memoire
