// ReplayMemory: memoire's episodic replay memory (the memoire API). Entries (s, a, r, p, v, q, i) live
// in a ring of `max_step` slots; an episode is a contiguous run of slots that may wrap. Whole
// oldest episodes are evicted when the ring or `max_episode` is full (lowering max_episode
// evicts at once). close_episode computes
// lambda-returns (q) and priority weights; sampling draws entries in proportion to weight.
//
// Entry identity: every entry has an absolute position `pos` (0, 1, 2, ... in insertion order);
// its slot is pos % max_step, so ring arithmetic is right for every capacity. Positions are the
// ids handed out by Sample and taken by UpdateWeights; an id whose entry was evicted is stale
// and skipped.
//
// Returns (per reward dimension d, gamma_d = discount_factor[d], lambda = mix_lambda), for an
// episode of L entries:
//   G[L-1] = r[L-1]                       if the episode terminated
//   G[L-1] = v[L-1]                       if it was truncated (terminal=false: bootstrap)
//   G[k]   = r[k] + gamma_d * ((1 - lambda) * v[k+1] + lambda * G[k+1])     for k < L-1
// Priority weights (alpha = priority_exponent, eps = priority_epsilon, c = reward_coeff):
//   w[k] = multiplier * init_w[k] * (|sum_d c_d * (G[k,d] - v[k,d])| + eps) ^ alpha
// and w[k] = multiplier * init_w[k] when weights are not updated. Weights are stored as float32:
// a non-finite w becomes 0, a finite w beyond float32's range saturates at its largest value.
// Entry k of an episode is sampleable when frame_stack-1 <= k, k + multi_step <= L-1, the
// episode is closed, and w[k] > 0.
//
// Memory: the columns and the per-slot bookkeeping are reserved (core/reserved.h) and become
// resident only where entries are written; the sum tree (16 bytes per slot, padded to a power
// of two) is allocated up front. Checkpoints: SaveTo / LoadFrom (replay_memory_checkpoint.cc).
//
// Compressed states (Make's compress_states): the state field `s` is kept out of the columns
// and stored LZ4-compressed, one heap block per entry (core/compressed_rows.h), so its memory
// is what the stored states compress to. Adds encode before taking the lock; every read
// (Sample, SampleDistinct, SaveTo) decodes under the lock, bit for bit, straight into its own
// output (decoding keeps no shared scratch). Checkpoints hold raw rows either way (the file
// format does not change): a compressed memory loads a checkpoint of an uncompressed one and
// the other way round.
//
// Thread safety: thread-safe. The memory's lock is a writer-preferring reader-writer lock
// (core/rw_lock.h):
// - Shared (run concurrently with each other): Sample, SampleDistinct, CheckFinite, options()
//   and the counts (num_episode, size, num_sampleable, total_weight, episode_open, open_length,
//   total_added, memory_bytes, stored_state_bytes, Info). Several threads' Samples copy their
//   batches at the same time (from Python: without the GIL).
// - Exclusive (alone): every writer (NewEpisode, AddEntry/AddEntries, CloseEpisode and its
//   evictions, UpdateWeights, SetOptions, Seed, LoadFrom) and SaveTo (it reads the generator).
//   A writer never overlaps a copy, so no batch is torn and a batch's settings (frame_stack,
//   multi_step) hold for its whole copy. A waiting writer bars new readers: continuous
//   sampling does not starve inserts.
// - The draw (the generator's steps and the sum-tree walk of Sample and SampleDistinct) is one
//   at a time, under a small draw lock inside the shared section: draws keep one order, so the
//   k-th Sample or SampleDistinct to draw gets the generator's k-th draw, bit for bit as when
//   the calls come one by one (SampleOut::on_draw tells a caller its place in that order).
// Sample copies a batch of more than 512 KiB with one extra thread, parked between batches
// (the scattered-row copies are latency-bound, so two threads nearly double throughput); while
// one Sample has it, the others copy on their own thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/columns.h"
#include "core/compressed_rows.h"
#include "core/helper_thread.h"
#include "core/protocol.h"
#include "core/reserved.h"
#include "core/rng.h"
#include "core/rw_lock.h"
#include "core/schema.h"
#include "core/status.h"
#include "core/sum_tree.h"

namespace memoire {

struct StreamBatch;  // core/stream_batch.h

class ReplayMemory {
 public:
  // Schema field order. q is computed by the memory; add calls ignore its input.
  enum FieldId { kState = 0, kAction, kReward, kProb, kValue, kQvest, kInfo, kNumFields };
  static constexpr const char* const* kFieldNames = protocol::kFieldNames;  // s a r p v q i
  static constexpr int kNumCacheFlags = 2 * kNumFields;

  // Checks the seed's rules: r, v, q float32 of one shape; p float32 of shape [] (the memoire API),
  // or of shape [] or [n], n >= 0, with `vector_prob` (the older constructor's prob_size).
  // `compress_states`: store the state field compressed (see the top of this file); fixed for
  // the memory's life.
  static Status Make(const Schema& schema, int64_t max_step, std::unique_ptr<ReplayMemory>* out,
                     bool vector_prob = false, bool compress_states = false);

  // ---- settings (validated; a rejected value changes nothing) ----
  struct Options {
    double priority_exponent = 0.0;  // alpha >= 0; 0 samples in proportion to init_w
    double priority_epsilon = 1e-6;  // eps >= 0 added to |td| before the exponent
    double mix_lambda = 0.95;        // in [0, 1]
    int frame_stack = 1;             // >= 1
    int multi_step = 1;              // >= 1
    int64_t cache_size = 128;        // >= 1
    int64_t max_episode = 0;         // >= 0; 0 means no limit beyond max_step
    bool reuse_cache = false;
    std::vector<float> discount_factor;  // one per reward element, each in [0, 1]; default 0.99
    std::vector<float> reward_coeff;     // one per reward element, finite; default 1.0
    std::vector<uint8_t> cache_flags;    // 14 flags: prev s,a,r,p,v,q,i then next; default all 1
    bool allow_nonfinite = false;        // store NaN/inf in r, p, v (refused by default)
  };
  Options options() const;
  // Replaces all settings at once; frame_stack/multi_step changes re-derive which stored
  // entries are sampleable (O(stored)).
  Status SetOptions(const Options& o);
  Status ValidateOptions(const Options& o) const;

  const Schema& schema() const { return schema_; }
  int64_t max_step() const { return max_step_; }
  int64_t reward_elems() const { return reward_elems_; }
  bool compress_states() const { return states_ != nullptr; }
  uint64_t uuid() const { return uuid_; }
  void set_uuid(uint64_t u) { uuid_ = u; }
  void Seed(uint64_t seed);

  // ---- episodes ----
  // Opens an episode; an episode still open is discarded.
  Status NewEpisode();
  // Appends one entry to the open episode. `fields[f]` points at one row of field f (q is
  // ignored and stored as zero). init_w must be finite and >= 0. Evicts the oldest episode
  // when the ring is full; fails (kResourceExhausted) when the open episode fills it alone.
  Status AddEntry(const void* const* fields, float init_w);
  // Appends n entries: fields[f] points at n consecutive rows of field f.
  Status AddEntries(int64_t n, const void* const* fields, const float* init_w);
  // The rule every add follows (AddEntries calls it; ChunkIngest calls it before a commit):
  // init_w finite, and r, p, v finite unless allow_nonfinite. The error (kInvalidArgument)
  // names the first offending field and row. Reads n rows of those fields.
  Status CheckFinite(int64_t n, const void* const* fields, const float* init_w) const;
  Status CloseEpisode(float multiplier, bool update_value, bool update_weight, bool terminal);

  // ---- counts ----
  int64_t num_episode() const;  // closed episodes stored
  int64_t size() const;         // entries stored, the open episode included
  int64_t num_sampleable() const;
  double total_weight() const;  // sum of sampleable weights: the sampling normaliser
  bool episode_open() const;
  int64_t open_length() const;
  uint64_t total_added() const;  // entries ever added (not counting discarded ones)

  // ---- sampling ----
  struct SampleOut {
    // Outputs may be null to skip them. prev[f]/next[f]: [n, frame_stack, *shape_f] rows.
    uint8_t* prev[kNumFields] = {};
    uint8_t* next[kNumFields] = {};
    float* weight = nullptr;   // [n] the entry's priority weight
    double* prob = nullptr;    // [n] weight / total_weight at sampling time
    uint8_t* done = nullptr;   // [n] 1 when next is the last entry of a terminated episode
    int64_t* id = nullptr;     // [n] entry ids for UpdateWeights
    // [1] each: num_sampleable() and total_weight() at the draw (the normaliser of prob).
    int64_t* num_sampleable = nullptr;
    double* total_weight = nullptr;
    // The frame_stack the outputs were sized for (0: not checked). Another thread may change
    // the setting between sizing and sampling; then Sample fails with kFailedPrecondition,
    // writing no output but `frame_stack_now` (if not null), the setting it found.
    int frame_stack = 0;
    int* frame_stack_now = nullptr;
    // Called (when set) once the entries are drawn, under the memory's draw lock, before the
    // copy: successive calls come in the order of the generator's draws, while the copies may
    // finish in any order. It must be quick and must not call into the memory.
    std::function<void()> on_draw;
  };
  // Draws n entries with probability proportional to weight (stratified over n equal slices
  // of the total, with replacement). kFailedPrecondition when nothing is sampleable.
  Status Sample(int64_t n, const SampleOut& out);
  // Draws as Sample does (the same generator steps: the same entries for the same seed and
  // contents) but writes each distinct stored row of the drawn stacks once, plus an index:
  // the sampling stream's batch (core/stream_batch.h, where it is defined). `on_draw` as
  // SampleOut's: called under the draw lock once the entries are drawn, before the copy.
  Status SampleDistinct(int64_t n, StreamBatch* out, const std::function<void()>& on_draw = {});
  // Sets the weight of entries by id (finite, >= 0); stale ids are skipped. Returns how many
  // were updated in *updated.
  Status UpdateWeights(int64_t n, const int64_t* ids, const float* weights, int64_t* updated);

  size_t memory_bytes() const;  // bytes held by storage, metadata and tree
  // Bytes of the stored states: their compressed blocks (without the allocator's headers)
  // with compress_states, else the raw rows of the stored entries.
  size_t stored_state_bytes() const;
  std::string Info() const;

  // ---- checkpoints (the file format: replay_memory_checkpoint.cc) ----
  // Writes everything the memory holds (stored entries, episodes, weights, settings, uuid,
  // the generator's state, counters) to `fd` from its current offset, streaming each stored
  // column straight from storage in pieces of kCheckpointPiece bytes. Holds the memory's lock
  // throughout (adds and samples wait). I/O failures: kInternal with detail "errno".
  Status SaveTo(int fd) const;
  // Replaces the whole memory with the checkpoint in `fd` (a regular file read from offset 0).
  // Strict: the header (magic, version, byte order, its checksum), this memory's schema and
  // max_step, every count and the file's exact size are checked before anything is allocated;
  // every section is checksummed and checked (episodes consistent, weights finite and >= 0,
  // settings valid) while it is read into a staging memory, which replaces this one's contents
  // only once all of it was read. Any problem: kDataLoss naming what was expected, and this
  // memory is unchanged.
  Status LoadFrom(int fd);
  static constexpr size_t kCheckpointPiece = size_t{4} << 20;
  // The checksum stored after section `section` of `n` bytes (for tools and tests).
  static uint64_t CheckpointChecksum(const void* data, size_t n, int section);

 private:
  ReplayMemory(const Schema& schema, int64_t max_step, bool compress_states);
  int64_t head_locked() const;
  size_t row_bytes(int f) const { return schema_.field(f).bytes(); }
  bool Sampleable(int64_t slot) const;  // by metadata and options, ignoring weight
  // Draws n slots (stratified, by weight) into slots[n] and writes out's weight, prob, done
  // and id of each (the outputs that are not null). The caller holds mu_ (shared at least)
  // and draw_mu_.
  Status DrawLocked(int64_t n, const SampleOut& out, int64_t* slots);
  void EvictOldestLocked();
  void RebuildTreeLocked();
  Status CheckCanAddLocked(int64_t n) const;
  void AdoptLocked(ReplayMemory& other);  // takes `other`'s whole state (same schema, max_step)
  bool Allocated() const {
    return cols_.allocated() && weight_.allocated() && pos1_.allocated() &&
           ep_start_.allocated() && ep_len_.allocated() && ep_term_.allocated() &&
           (!states_ || states_->allocated());
  }
  // The absolute position of the entry in `slot`, -1 when none.
  int64_t pos(int64_t slot) const { return pos1_[slot] - 1; }
  void set_pos(int64_t slot, int64_t position) { pos1_[slot] = position + 1; }

  const Schema schema_;
  const int64_t max_step_;
  int64_t reward_elems_ = 1;
  uint64_t uuid_ = 0;

  // Writers hold mu_ exclusively; Sample/SampleDistinct and the counts hold it shared (see the
  // top of this file). Members "guarded by mu_" are written only under the exclusive lock.
  mutable RwLock mu_;
  std::mutex draw_mu_;  // the draw (rng_ and its order), inside a shared or exclusive mu_
  std::mutex helper_mu_;  // held (try-locked) by the one Sample using helper_
  HelperThread helper_;  // copies half of a large batch in Sample; used under helper_mu_
  Options opt_;                 // guarded by mu_
  Columns cols_;                // guarded by mu_; without the states when states_ is set
  std::unique_ptr<CompressedRows> states_;  // compress_states: the states, else null
  // Per-slot bookkeeping, reserved like the columns (core/reserved.h): zero until written, and
  // resident only where slots were used, so an empty memory costs little beyond its tree.
  ReservedArray<float> weight_;     // per slot: init_w until close, then w
  ReservedArray<int64_t> pos1_;     // per slot: absolute position + 1 (0: no entry); pos()
  ReservedArray<int64_t> ep_start_;  // per slot: position of its episode's first entry
  ReservedArray<int64_t> ep_len_;    // per slot: episode length (0 while open)
  ReservedArray<uint8_t> ep_term_;   // per slot: episode terminated (vs truncated)
  SumTree tree_;
  Rng rng_;  // guarded by mu_ exclusive, or shared with draw_mu_
  struct Episode { int64_t start, length; };
  std::deque<Episode> episodes_;  // closed episodes, oldest first
  bool open_ = false;
  int64_t open_start_ = 0;
  int64_t tail_ = 0;  // position of the next entry
  int64_t sampleable_ = 0;
  uint64_t total_added_ = 0;
};

}  // namespace memoire
