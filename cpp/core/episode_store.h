// EpisodeStore: what ChunkIngest (core/chunk_ingest.h) stores finished episodes into. One
// experience path for every store: actors stream an episode in chunks, the ingest checks and
// assembles them, and the store takes the whole episode in one Commit. Three stores implement
// it (core/episode_store.cc):
//   - ReplayMemory (memoire's episodic memory): rows s, a, r, p, v, i and a per-row init_w;
//     the episode is closed with the chunk's multiplier and flags (returns computed there).
//   - CircularBuffer (Dopamine's TF circular and prioritized buffers): the schema's rows
//     (observation, action, reward, terminal, extras); the last row ends the episode
//     (episode_end); new rows get the tree's max recorded priority, as Dopamine's add does
//     without a priority.
//   - TransitionStore (Dopamine's JAX buffer): rows observation, action (their dtypes and
//     shapes are the Python face's, given at construction), reward float64, terminal bool;
//     the last row ends the episode; new elements get the leaf value set_priority gave (the
//     agent's rule; the owner updates it as its priorities change).
//
// Thread safety: implementations are thread-safe as their stores are; ChunkIngest serialises
// Commit calls. Nothing else may add to a store while an ingest commits into it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/codec.h"
#include "core/status.h"

namespace memoire {

class ReplayMemory;
class CircularBuffer;
class TransitionStore;

class EpisodeStore {
 public:
  virtual ~EpisodeStore() = default;

  // The columns one row of a chunk carries, in message order: name, dtype, shape [-1, *row].
  const std::vector<codec::ArraySpec>& row_spec() const { return row_spec_; }
  // The most rows one episode may have (ReplayMemory's max_step; otherwise no limit beyond the
  // ingest's byte budgets).
  virtual int64_t max_episode_rows() const { return INT64_MAX; }

  // One chunk's rows: columns[c] points at `rows` rows of row_spec()[c] (unaligned bytes).
  struct Part {
    int64_t rows = 0;
    std::vector<const void*> columns;
  };
  // The closing facts of an episode (the last chunk's).
  struct End {
    float multiplier = 1.0f;  // ReplayMemory: close_episode's episodic weight multiplier
    bool terminal = false;
    bool update_value = false, update_weight = false;  // ReplayMemory's close flags
  };

  // Checks an episode against what the store would refuse (non-finite or negative values),
  // before anything is stored. kInvalidArgument; *nonfinite tells a NaN/inf from another refusal.
  virtual Status Check(const std::vector<Part>& parts, const End& end, bool* nonfinite) const = 0;
  // Stores the episode (parts in order). A store may still fail (capacity, counter limits);
  // then the episode's rows already stored stay for Dopamine's stores (as adds one at a time
  // would) and are discarded for ReplayMemory.
  virtual Status Commit(const std::vector<Part>& parts, const End& end) = 0;

 protected:
  std::vector<codec::ArraySpec> row_spec_;
};

std::unique_ptr<EpisodeStore> EpisodeStoreOf(std::shared_ptr<ReplayMemory> memory);
// allow_nonfinite: store NaN/inf rewards (Dopamine's own buffers do; a server refuses them).
std::unique_ptr<EpisodeStore> EpisodeStoreOf(std::shared_ptr<CircularBuffer> buffer,
                                             bool allow_nonfinite);

// The JAX store's adapter: it needs the Python face's observation and action dtypes and
// shapes, and the leaf value for new elements (prioritized stores), which the owner sets.
class TransitionEpisodeStore : public EpisodeStore {
 public:
  // Fails (kInvalidArgument) when the dtypes and shapes do not make the store's frame and
  // action byte sizes.
  static Status Make(std::shared_ptr<TransitionStore> store, DType observation_dtype,
                     const std::vector<int64_t>& observation_shape, DType action_dtype,
                     const std::vector<int64_t>& action_shape, bool allow_nonfinite,
                     std::unique_ptr<TransitionEpisodeStore>* out);
  // The leaf value every new element gets (finite, >= 0; ignored by a uniform store).
  Status set_priority(double value);
  double priority() const { return priority_.load(); }

  Status Check(const std::vector<Part>& parts, const End& end, bool* nonfinite) const override;
  Status Commit(const std::vector<Part>& parts, const End& end) override;

 private:
  TransitionEpisodeStore(std::shared_ptr<TransitionStore> store, bool allow_nonfinite);
  const std::shared_ptr<TransitionStore> store_;
  const bool allow_nonfinite_;
  std::atomic<double> priority_{1.0};
};

}  // namespace memoire
