// StreamSource: the learner's end of a sampling stream (core/stream_batch.h is the batch and its
// wire layout; core/stream_hub.h the server's end). A learner's connection works one of two
// ways:
// - rows in the messages: a source of the prefetching feed (bindings/feed.cc): the feed's
//   sampler thread receives each batch from a DEALER socket and stacks it into a ring slot,
//   with no GIL (Fill);
// - shared memory (one host): the server wrote each batch into a slot of the mapping in the
//   final layout; Next takes its notice from the mapping's ring (core/stream_ring.h) and the
//   learner hands out views of the slot, which goes back to the server through the ring
//   (Release) once the batch's arrays are dropped. No copy, and no message per batch: the
//   socket carries the open, pings, priorities and the server's refusals.
// StreamSlots hands a shared-memory stream's slots to a device feed (core/device_ring.h) as its
// host ring. The socket is a libzmq handle (core/libzmq.h): pyzmq's socket, which its owner
// does not use while the source lives.
//
// Thread safety: StreamSource's socket is used by one thread at a time (its io mutex): the
// receiving thread, any thread posting a message (Post) in between. Next takes notices one
// thread at a time; Release may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/codec.h"
#include "core/device_ring.h"
#include "core/libzmq.h"
#include "core/shm_region.h"
#include "core/status.h"
#include "core/stream_batch.h"
#include "core/stream_ring.h"

namespace memoire {

class StreamSource {
 public:
  struct Options {
    void* socket = nullptr;   // a connected DEALER (pyzmq's `underlying`), owned by Python
    StreamLayout layout;
    codec::Limits limits;
    int timeout_ms = 10000;   // a batch must arrive within this (else the draw fails)
    int ping_ms = 500;        // while waiting, a credit of 0 goes out this often
    int64_t credit_chunk = 1; // over the socket: credit returned after this many batches
    // Encoded control messages (memoire.codec frames): a credit of credit_chunk, of 0.
    std::vector<std::string> credit_message, ping_message;
    // Shared memory: the mapping, its ring (attached) and its slots (each
    // slot_layout.slot_bytes, from byte slots_at).
    std::shared_ptr<ShmRegion> shm;
    StreamRing ring;
    size_t slots_at = 0;
    int64_t slots = 0;
    BatchLayout slot_layout;
  };
  explicit StreamSource(Options o)
      : opt_(std::move(o)), ring_(opt_.ring), held_(static_cast<size_t>(opt_.slots), 0) {}
  // Shared memory: maps the server's StreamShm at `path` (its ring, then `slots` slots of
  // `slot_bytes`, which must be the slots of o->layout exactly) into *o (shm, ring, slots_at,
  // slots, slot_layout). kDataLoss when the sizes differ; the name is removed once mapped.
  static Status MapSlots(const std::string& path, int64_t slots, uint64_t slot_bytes, Options* o);

  // Receives the next batch into `parts` (the feed's ReplayMemory layout plus num_sampleable
  // and total_weight, see UnstackStreamBatch). kFailedPrecondition with the detail "timeout"
  // (ms) when none came in time, with "server_error" 1 when the server refused something (its
  // reason in the message), or when stopped; kDataLoss on a malformed batch.
  Status Fill(int thread, uint8_t* const* parts);
  // Shared memory: takes the next batch's notice into *slot (its parts at slot_data).
  // Errors as Fill's, and kFailedPrecondition with the detail "held" when the learner holds
  // every slot (no batch can come until one is released).
  Status Next(int64_t* slot);
  // Shared memory: the learner is done with the batch in `slot` (the server may write it
  // again); it goes back through the ring at once. Ignores a slot not handed out.
  void Release(int64_t slot);
  uint8_t* slot_data(int64_t slot) const {
    return opt_.shm->data() + opt_.slots_at +
           static_cast<size_t>(slot) * opt_.slot_layout.slot_bytes;
  }
  bool shared_memory() const { return opt_.shm != nullptr; }
  int64_t slots() const { return opt_.slots; }  // shared memory: the mapping's slots
  bool stopped() const { return stopping_.load(); }
  // Queues an encoded message (frames) for the server; it leaves at once unless another
  // thread holds the socket, and then as that thread lets go of it (within a few ms).
  void Post(std::vector<std::string> frames);
  // Makes a Fill in progress return (kFailedPrecondition) within a few milliseconds.
  void Stop() { stopping_.store(true); }

  const StreamLayout& layout() const { return opt_.layout; }
  const BatchLayout& slot_layout() const { return opt_.slot_layout; }
  int64_t received() const { return received_.load(); }
  int64_t credit_returned() const { return credit_returned_.load(); }
  int64_t last_seq() const { return last_seq_.load(); }

 private:
  // Sends queued messages and the credit due (rows in messages); io_mu_ held.
  void FlushLocked();
  // After letting go of the socket (and in Post): sends what was queued meanwhile, unless
  // another thread holds the socket now (which does the same as it lets go).
  void SendQueued();
  using Clock = std::chrono::steady_clock;
  // One turn at the socket (io_mu_ taken): sends what is queued and a ping when *next_ping is
  // due, then receives into *frames, waiting up to wait_ms (*got: one came).
  Status SocketTurn(Clock::time_point* next_ping, int wait_ms, libzmq::Frames* frames,
                    bool* got);
  // What a receive returns when no batch came within timeout_ms.
  Status TimedOut() const;
  // Waits for the next message into *frames: OK, or the timeout's / stop's / socket's error.
  Status Receive(libzmq::Frames* frames);
  // Shared memory: the batch or failed draw that notice `n` announces.
  Status TakeNotice(const StreamRing::Notice& n, int64_t* slot);

  const Options opt_;
  StreamRing ring_;                       // notices: take_mu_; credits: queue_mu_
  std::mutex take_mu_;                    // one Next at a time
  Clock::time_point next_socket_read_{};  // take_mu_
  std::mutex io_mu_;                      // the socket's one user at a time
  std::mutex queue_mu_;                   // guards queue_, held_, num_held_
  std::deque<std::vector<std::string>> queue_;
  std::atomic<bool> queued_{false};       // queue_ is not empty (written under queue_mu_)
  int64_t owed_ = 0;                      // batches received since credit was returned; io_mu_
  std::vector<uint8_t> held_;             // shared memory: slots the learner has; queue_mu_
  int64_t num_held_ = 0;                  // queue_mu_
  UnstackScratch scratch_;  // the receiving thread's: its helper, decoded rows
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> received_{0}, credit_returned_{0}, last_seq_{-1};
};

// A shared-memory stream's slots as the host ring of a device feed: the copy thread takes each
// batch's notice, copies the slot the server wrote, and gives it back at once. Thread safety:
// the source's (Take one thread at a time, Release from any).
class StreamSlots : public HostBatches {
 public:
  explicit StreamSlots(std::shared_ptr<StreamSource> source) : source_(std::move(source)) {
    const BatchLayout& l = source_->slot_layout();
    for (const BatchPart& p : l.parts) part_bytes_.push_back(p.none ? 0 : p.bytes);
    parts_.resize(static_cast<size_t>(source_->slots()));
    for (int64_t s = 0; s < source_->slots(); ++s) {
      parts_[s].resize(l.parts.size());
      l.PartsAt(source_->slot_data(s), parts_[s].data());
    }
  }
  Status Take(int* slot) override {
    *slot = -1;
    int64_t s = -1;
    Status status = source_->Next(&s);
    if (status.ok()) *slot = static_cast<int>(s);
    return status;
  }
  bool closed() const override { return source_->stopped(); }
  void Release(int slot) override { source_->Release(slot); }
  uint8_t* const* parts(int slot) const override { return parts_[slot].data(); }
  const std::vector<size_t>& part_bytes() const override { return part_bytes_; }
  int slots() const override { return static_cast<int>(source_->slots()); }
  uint8_t* block(int slot) const override { return source_->slot_data(slot); }
  size_t block_bytes() const override { return source_->slot_layout().slot_bytes; }
  void Close() override { source_->Stop(); }

 private:
  std::shared_ptr<StreamSource> source_;
  std::vector<size_t> part_bytes_;
  std::vector<std::vector<uint8_t*>> parts_;  // per slot, per part (null for none parts)
};

}  // namespace memoire
