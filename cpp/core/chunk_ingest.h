// ChunkIngest: the one receiving end of experience. Actors stream each episode in CHUNK
// messages (core/codec.h) of a header frame plus one data frame per entry:
//   the store's row columns   dtype[n, *shape] (EpisodeStore::row_spec(): for memoire's
//                              memory s, a, r, p, v, i and init_w; for Dopamine's buffers
//                              observation, action, reward, terminal, ...)
//   uuid               uint64[]  the actor
//   episode, index     int64[]   the actor's episode number and the chunk's place in it (0, 1, ..)
//   multiplier         float32[] close_episode's episodic weight multiplier (read on the last)
//   info               float64[3], optional: the actor's account of the episode (return,
//                      length, terminated), read on the last chunk and handed back with the
//                      committed episode (TakeCommitted); never stored
// and flags kLast | kTerminal | kUpdateValue | kUpdateWeight (the last chunk closes the episode).
// An actor with nothing to send for its keepalive interval sends a KEEPALIVE message (its uuid,
// core/protocol.h) on the same channel, checked as strictly as a chunk.
//
// Ingest checks a message (header, entry table, dtypes and shapes against the store's row
// spec), keeps each actor's open episode (the chunks received of the episode it is sending;
// "stream" elsewhere in memoire means a ChunkStream or a SamplingStream, not this) and, on the
// last chunk, commits the whole episode into the store (core/episode_store.h), so episodes of
// many actors never interleave in it. Rows are never copied before the commit:
// an open episode keeps pointers into the received frames, which the caller keeps alive under
// an opaque `owner` id until a Result lists that owner in `released`.
//
// Open-episode rules (per actor uuid; a rejected chunk never touches the store):
//   - a chunk of another episode than the actor's open one drops that one
//     (abandoned_episode), then is treated as a first chunk;
//   - a first chunk must have index 0 (out_of_order_chunk);
//   - opening an episode when max_open_episodes are open drops the least recently seen one
//     (stream_limit);
//   - a chunk whose index is not the next one drops the open episode (out_of_order_chunk);
//   - a chunk that would make the episode longer than the store takes drops it
//     (episode_too_long);
//   - a chunk that would make its open episode hold more than max_episode_bytes drops it
//     (stream_bytes); a chunk is charged its frames' bytes plus kChunkOverhead, so a flood of
//     empty chunks is bounded too;
//   - a chunk that would make all open episodes hold more than max_open_bytes drops the
//     largest (its own included) until it fits (open_bytes): a hog goes first;
//   - liveness: an actor whose open episode the receiver has not heard from (no chunk, no
//     KEEPALIVE with its uuid) for peer_timeout seconds of listening time is gone (killed,
//     frozen, its machine lost): its open episode, and only its, is dropped (peer_lost).
//     Listening time is the owner's reading time: Ingest, Keepalive and Listen say when the
//     owner reads, and a gap between two reads counts at most kListenGapFraction x
//     peer_timeout (capped at kMaxListenGap s), so an owner that stops reading (a rate limiter
//     holding inserts back, a learner busy training) never finds its live actors silent: it
//     hears from them again once it reads their queued messages;
//   - an actor that lost its open episode to peer_lost and is heard from again (a partition
//     that healed, a frozen process that woke) is reported once (TakeReturned: how long it
//     was silent, what it lost); the rest of the lost episode, still on its way then, is
//     dropped as its start was (out_of_order_chunk) but marked `quiet` (already reported);
//   - open episodes with no chunk for open_episode_timeout seconds are dropped (stale_episode:
//     an actor alive but stuck mid-episode), checked every min(10, open_episode_timeout) s of `now`
//     (by Ingest, and by Reap when no chunk comes);
//   - an episode the store refuses before storing (EpisodeStore::Check: a NaN or infinite
//     reward unless allowed, init_w or multiplier) is dropped (nonfinite), and one with a
//     negative init_w or multiplier (bad_episode): nothing stored is touched;
//   - a message that is no valid chunk is dropped (malformed).
//
// Cost per chunk: the header decode (a few hundred ns) and a hash lookup; a commit copies each
// row once, into the store, under the store's own lock per chunk, so samplers interleave with
// a long commit.
//
// Thread safety: thread-safe. Stream state is guarded by mu_; commits are serialised by
// commit_mu_ (an episode goes into a store contiguously). Nothing else may add to the store
// while a ChunkIngest commits into it; sampling and priority updates may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <deque>

#include "core/codec.h"
#include "core/episode_store.h"
#include "core/protocol.h"
#include "core/replay_memory.h"
#include "core/status.h"

namespace memoire {

class ChunkIngest {
 public:
  // Flags of a chunk message.
  static constexpr uint8_t kLast = protocol::kChunkLast, kTerminal = protocol::kChunkTerminal,
                           kUpdateValue = protocol::kChunkUpdateValue,
                           kUpdateWeight = protocol::kChunkUpdateWeight;

  enum Reason {
    kMalformed = 0, kAbandonedEpisode, kOutOfOrderChunk, kStreamLimit, kStaleEpisode,
    kEpisodeTooLong, kBadEpisode, kStreamBytes, kOpenBytes, kNonFinite, kPeerLost,
    kNumReasons,
  };
  static const char* ReasonName(int reason);  // "malformed", "abandoned_episode", ...

  struct Options {
    uint64_t max_message_bytes = uint64_t(1) << 30;  // payload bytes of one message
    int64_t max_open_episodes = 4096;                // >= 1
    double open_episode_timeout = 600.0;             // seconds, > 0
    int64_t max_episode_bytes = int64_t(256) << 20;  // bytes one open episode holds, >= 1
    int64_t max_open_bytes = int64_t(1) << 30;       // bytes all open streams hold, >= 1
    double peer_timeout = 10.0;  // seconds of listening without a word from an actor, > 0
  };
  // A gap between two reads of the owner counts as listening time up to
  // min(kMaxListenGap, kListenGapFraction * peer_timeout) seconds (see the liveness rule).
  static constexpr double kListenGapFraction = 0.25;
  static constexpr double kMaxListenGap = 0.5;
  // Bytes a chunk is charged besides its frames: its bookkeeping, the message's, and the
  // receive buffer a held message keeps alive (libzmq's messages point into 8 KiB batches);
  // measured at up to ~4 KiB per held empty chunk (benchmarks/hostile_rss.py).
  static constexpr int64_t kChunkOverhead = 4096;

  // A received frame: caller-owned bytes.
  using Frame = codec::Frame;

  // kNotChunk (not a current-version chunk header: the caller decodes it another way),
  // kStaged (accepted; the stream is still open), kCommitted (accepted, and the episode it
  // closed is stored), kRejected (dropped: `reason`, `detail`).
  using Outcome = protocol::IngestOutcome;
  struct Result {
    Outcome outcome = Outcome::kNotChunk;
    int64_t rows = 0;          // kStaged: rows of the chunk; kCommitted: rows of the episode
    int reason = kMalformed;   // kRejected
    int64_t reason_count = 0;  // kRejected: chunks dropped for this reason so far (log rates)
    std::string detail;        // kRejected: what was wrong, for the log
    bool quiet = false;        // kRejected: the tail of an episode already reported lost (a
                               // returned actor's, see TakeReturned): counted, not logged
    std::vector<uint64_t> released;  // owners no longer referenced: their frames may go
  };

  struct Counters {
    int64_t chunks = 0;        // chunk messages that passed the checks
    int64_t keepalives = 0;    // KEEPALIVE messages that passed the checks
    int64_t open_streams = 0;
    int64_t open_bytes = 0;    // charged to open streams (frames + kChunkOverhead per chunk)
    int64_t rejected[kNumReasons] = {};
  };

  // Fails (kInvalidArgument) on a null store or options out of range.
  static Status Make(std::shared_ptr<EpisodeStore> store, const Options& options,
                     std::unique_ptr<ChunkIngest>* out);
  // Into memoire's episodic memory (EpisodeStoreOf(memory)).
  static Status Make(std::shared_ptr<ReplayMemory> memory, const Options& options,
                     std::unique_ptr<ChunkIngest>* out);

  // A stored episode, as the owner of the store learns of it (TakeCommitted).
  struct Committed {
    uint64_t uuid = 0;
    int64_t episode = 0;
    int64_t rows = 0;
    bool has_info = false;
    double info[protocol::kChunkInfoSize] = {};  // the last chunk's `info`, when it had one
  };
  // The most Committed records kept for TakeCommitted; older ones go (counted).
  static constexpr size_t kCommittedLog = 4096;
  // Moves out the records of episodes stored since the last call, oldest first; *dropped (if
  // not null) gets how many records were lost to the log's bound since the last call.
  std::vector<Committed> TakeCommitted(int64_t* dropped);

  // Takes one message (a CHUNK or a KEEPALIVE): frames[0] is the header, frames[1..n) the data
  // frames. `now` is a monotonic time in seconds; the call counts as a read of the owner
  // (Listen). Every owner in out->released, this one included when it is not kept, may be freed
  // by the caller; an owner is kept only while its stream is open. A KEEPALIVE yields
  // kKeepalive and is never kept.
  void Ingest(uint64_t owner, const Frame* frames, size_t n, double now, Result* out);

  // The owner reads its socket at `now` (a receive call starts or ends, or a poll found
  // nothing): advances the listening time and drops the open streams of actors silent past
  // peer_timeout of it (peer_lost); their owners go into *released. Returns how many went.
  // Not called while the owner does not read (a rate limiter holds inserts back).
  int64_t Listen(double now, std::vector<uint64_t>* released);

  // The open episodes dropped as peer_lost since the last call, oldest first: (actor uuid,
  // episode). At most kCommittedLog are kept (older ones are only counted).
  std::vector<std::pair<uint64_t, int64_t>> TakeLost();

  // An actor heard from again (a chunk or a KEEPALIVE) after it lost its open episode to
  // peer_lost: how long it had been silent and what it lost while away.
  struct Returned {
    uint64_t uuid = 0;
    double silent = 0;      // seconds of `now` between its last message before and this one
    int64_t episode = 0;    // the (last) episode it lost
    int64_t episodes = 0;   // open episodes it lost while away (1 unless it came and went)
    int64_t rows = 0;       // their rows received before they were dropped
    int64_t count = 0;      // returns reported so far (log rates)
  };
  // Moves out the returns since the last call, oldest first. At most kCommittedLog actors are
  // watched for their return (a further lost one is only counted as peer_lost).
  std::vector<Returned> TakeReturned();

  // Drops open episodes silent for open_episode_timeout (as Ingest does when a chunk comes); their owners
  // go into *released. Cheap when called often: it looks at most every min(10, timeout) s.
  void Reap(double now, std::vector<uint64_t>* released);

  // The open streams: (actor uuid, episode, rows so far), in no particular order.
  struct OpenStream {
    uint64_t uuid;
    int64_t episode, rows;
  };
  std::vector<OpenStream> OpenStreams() const;

  Counters counters() const;
  Options options() const;
  Status SetOptions(const Options& options);

 private:
  struct Chunk {
    uint64_t owner;
    int64_t rows;
    int64_t bytes;  // charged against the budgets
    std::vector<const void*> columns;  // into the owner's frames, one per row_spec column
  };
  struct Stream {
    int64_t episode = 0;
    int64_t next_index = 0;
    int64_t rows = 0;
    int64_t bytes = 0;
    double last_seen = 0;  // `now` of its last chunk (stale_episode)
    double heard = 0;      // listening time of its actor's last message (peer_lost)
    double last_word = 0;  // `now` of its actor's last message (a chunk or a KEEPALIVE)
    std::vector<Chunk> chunks;
  };

  ChunkIngest(std::shared_ptr<EpisodeStore> store, const Options& options);
  // The last chunk's episode-level entries.
  struct Tail {
    float multiplier = 1.0f;
    bool has_info = false;
    double info[protocol::kChunkInfoSize] = {};
  };
  // Checks the message against the chunk layout; fills `chunk` (owner set by the caller).
  Status Parse(const Frame* frames, size_t n, Chunk* chunk, uint64_t* uuid, int64_t* episode,
               int64_t* index, Tail* tail, uint8_t* flags) const;
  void DropLocked(std::unordered_map<uint64_t, Stream>::iterator it, int reason,
                  std::vector<uint64_t>* released);
  void ReapLocked(double now, std::vector<uint64_t>* released);
  // Advances listen_clock_ to `now` (a gap counted at most the listen cap) and drops the
  // streams silent past peer_timeout of it. Returns how many went. Under mu_.
  int64_t ListenLocked(double now, std::vector<uint64_t>* released);
  // An actor whose open episode went as peer_lost, until it starts another episode.
  struct Away {
    double last_word = 0;  // `now` of its last message before
    int64_t episode = 0;   // the last episode it lost (its late chunks are dropped quietly)
    int64_t episodes = 0, rows = 0;
    bool back = false;  // heard from again (reported)
  };
  // Notes that `uuid` spoke at `now`: an actor away is reported back (TakeReturned). Under mu_.
  void HeardLocked(uint64_t uuid, double now);
  // Handles a KEEPALIVE message (header already peeked). Under mu_.
  void KeepaliveLocked(const Frame* frames, size_t n, double now, Result* out);
  void Reject(int reason, std::string detail, Result* out);
  // Drops the largest streams until `it` may take `bytes` more within max_open_bytes; false
  // (and `it` dropped too) when `it` is the largest. Under mu_.
  bool MakeRoomLocked(std::unordered_map<uint64_t, Stream>::iterator it, int64_t bytes,
                      std::vector<uint64_t>* released);
  // Stores a finished stream; on failure *reason says why (kNonFinite or kBadEpisode).
  Status Commit(const Stream& st, const Tail& tail, uint8_t flags, int* reason);

  const std::shared_ptr<EpisodeStore> store_;
  std::vector<codec::ArraySpec> spec_;  // the chunk layout: store_'s rows, then the entries below
  int spec_uuid_, spec_episode_, spec_index_, spec_multiplier_, spec_info_;

  mutable std::mutex mu_;
  Options opt_;                                  // guarded by mu_
  std::unordered_map<uint64_t, Stream> streams_;  // guarded by mu_
  Counters counts_;                              // guarded by mu_ (open_bytes: the total)
  double last_reap_ = -1;                        // guarded by mu_; < 0 before the first chunk
  double listen_clock_ = 0;       // guarded by mu_; listening seconds so far
  double last_listen_ = -1;       // guarded by mu_; `now` of the last read, < 0 before it
  double last_liveness_ = 0;      // guarded by mu_; listen_clock_ of the last silence check
  std::mutex commit_mu_;  // serialises commits into store_ (episodes stay contiguous)
  std::deque<Committed> committed_;  // guarded by mu_; at most kCommittedLog
  std::deque<std::pair<uint64_t, int64_t>> lost_;  // guarded by mu_; at most kCommittedLog
  std::unordered_map<uint64_t, Away> away_;         // guarded by mu_; at most kCommittedLog
  std::deque<Returned> returned_;                   // guarded by mu_; at most kCommittedLog
  int64_t returns_ = 0;                             // guarded by mu_; returns ever reported
  int64_t committed_dropped_ = 0;    // guarded by mu_
};

}  // namespace memoire
