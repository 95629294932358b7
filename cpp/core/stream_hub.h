// StreamHub: the server's end of its sampling streams, one per stream worker's ROUTER socket
// (core/stream_batch.h is the batch and its wire layout; core/stream_source.h the learner's
// end). ServerShm is a shared-memory stream's mapping on the server's side.
//
// The socket is a libzmq handle (core/libzmq.h): pyzmq's ROUTER, which its owner uses only
// between polls, on the same thread.
//
// Thread safety: Poll and the socket are the worker thread's (one at a time, as libzmq wants);
// every other method is thread-safe (mu_ guards the samplers).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/batch_layout.h"
#include "core/libzmq.h"
#include "core/rate_limiter.h"
#include "core/replay_memory.h"
#include "core/schema.h"
#include "core/shm_region.h"
#include "core/status.h"
#include "core/stream_batch.h"
#include "core/stream_ring.h"
#include "core/stream_rows_sampler.h"
#include "core/stream_sampler.h"

namespace memoire {

// A stream's shared memory on the server's side: the mapping (its ring, then its slots) and
// the layout its batches are written in (fixed at open).
struct ServerShm {
  // A new mapping (ShmRegion::Create) for `slots` batches of `layout`, its ring laid out empty.
  static Status Create(const StreamLayout& layout, int64_t slots, std::shared_ptr<ServerShm>* out);

  std::unique_ptr<ShmRegion> region;
  StreamLayout layout;
  BatchLayout slot_layout;
  int64_t slots = 0;
  uint8_t* ring() const { return region->data(); }
  uint8_t* slot_base() const { return region->data() + StreamRing::Bytes(slots); }
};

// The layout of a stream of batches of n from `rm` as it is set now.
StreamLayout MemoryStreamLayout(const ReplayMemory& rm, int64_t n);

// The native side of one stream worker's ROUTER socket. It keeps each stream's sampler
// threads: a shared-memory stream's (core/stream_sampler.h, which trade notices and slots with
// their learner through the stream's ring, no socket involved) and a rows stream's
// (core/stream_rows_sampler.h, whose batches this hub sends as they come out, in order). It
// waits on the socket with the GIL released (Poll), sending the rows streams' batches
// meanwhile; every message received goes to Python, and so does a shared-memory sampler's
// refused credit (refusals). Only the worker's thread uses the socket: Poll, and Python between
// polls.
class StreamHub {
 public:
  // A hub on `socket` (a ROUTER); kResourceExhausted when its wake-up eventfd cannot be made.
  static Status Make(void* socket, std::shared_ptr<StreamHub>* out);
  ~StreamHub();
  StreamHub(const StreamHub&) = delete;
  StreamHub& operator=(const StreamHub&) = delete;

  // Starts the sampler of `identity`'s shared-memory stream (its slots in `shm`), replacing
  // any stream of that peer.
  Status Add(const std::string& identity, std::shared_ptr<ReplayMemory> rm,
             std::shared_ptr<ServerShm> shm, int threads, int64_t ahead,
             std::shared_ptr<RateLimiter> limiter, int error_pause_ms, int limited_pause_ms);

  // Starts the sampler of `identity`'s rows stream (its batches sent to it on this socket by
  // Poll, each within send_timeout_ms), replacing any stream of that peer.
  Status AddRows(const std::string& identity, StreamRowsSampler::Options o, int send_timeout_ms);

  // Stops `identity`'s sampler (joins its threads) and forgets it, with any batch not yet sent;
  // false when there is none.
  bool Remove(const std::string& identity);

  // Stops and forgets every sampler.
  void Clear();

  // `identity`'s shared-memory / rows sampler; null when it has none.
  std::shared_ptr<StreamSampler> Find(const std::string& identity);
  std::shared_ptr<StreamRowsSampler> FindRows(const std::string& identity);

  // Waits up to timeout_ms for a message (*out set to it, for Python) or a sampler's refused
  // credit (returns with *out empty: see Refusals), sending the rows streams' batches as they
  // come. kFailedPrecondition on a socket error.
  Status Poll(int timeout_ms, std::unique_ptr<libzmq::Frames>* out);

  // (identity, why) of each sampler that refused its learner's credit and draws no more.
  std::vector<std::pair<std::string, std::string>> Refusals();

  StreamCounts& counts() { return *counts_; }

 private:
  struct RowsStream {
    std::shared_ptr<StreamRowsSampler> sampler;
    Schema schema;  // the memory's, for the batches' headers
    int send_timeout_ms = 1000;
  };

  StreamHub(void* socket, int wake_fd);

  // Sets *flag and wakes Poll (a full eventfd counter still wakes it).
  void Wake(std::atomic<bool>* flag);

  // Sends each rows stream's finished outcomes, in order: a batch, or a failed draw as an
  // ERROR of kind SampleError (its credit spent, as a batch's). A message that cannot be
  // queued in time (a peer gone) is dropped and counted: the learner notices by its timeout.
  void SendReady();

  void* const socket_;
  const int wake_fd_;
  std::shared_ptr<StreamCounts> counts_;
  std::atomic<bool> sends_due_{false};  // a rows sampler has outcomes ready
  std::atomic<bool> refused_{false};    // a shared-memory sampler refused a credit
  std::mutex mu_;  // guards samplers_ and rows_
  std::map<std::string, std::shared_ptr<StreamSampler>> samplers_;
  std::map<std::string, std::shared_ptr<const RowsStream>> rows_;
};

}  // namespace memoire
