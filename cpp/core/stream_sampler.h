// StreamSampler: the server's end of one shared-memory sampling stream (core/stream_batch.h).
// N threads each take a free slot, ask the server's rate limiter, draw a batch from the memory
// straight into the slot in the learner's layout (core/batch_layout.h) and publish its notice
// in the stream's ring (core/stream_ring.h): a batch, or a failed draw that spent the slot,
// its reason written into the slot. The slots the learner gives back arrive in the same ring;
// the threads take them as they look for a free slot, and sleep on the ring while none is.
// Nothing here takes the GIL or touches a socket: a batch costs no message.
//
// Order: each draw takes its place in the outcome queue at the moment the memory draws it,
// under the memory's draw lock (ReplayMemory::SampleOut::on_draw), and batches are numbered
// and published as they leave the queue's front, finished, so batch seq k is the stream's
// k-th successful draw from the memory and the notices leave in draw order whatever the
// number of threads. The copies themselves overlap: Sample holds the memory's lock shared
// (writers wait; other samplers copy alongside), so N threads copy N batches at once. When
// the stream is the memory's only sampler, its batch seq k is the k-th batch get_batch would
// draw with the same seed and contents, for any number of threads.
//
// Slots: every slot is free (the server's) at start; a published slot is the learner's
// (held) until its credit comes back; the slot freed last is written first (its lines are
// likelier in cache). Ahead: the threads draw only while fewer than `ahead` batches are
// drawn and not yet taken by the learner (the ring's notice tail), free slots or not: a
// learner slower than the server then reads each batch a few batches after it was written,
// while it is still in cache, not `slots` batches later (an Atari batch copied out of a slot
// took 0.35 ms that way, against 0.17 ms from a fresh get_batch, on 2 cores); the slots beyond
// `ahead` are for the batches the learner holds. A credit that is not honest (a slot the
// learner does not hold, a head that jumps) stops the stream's draws for good: refusal() says
// why, and `wake` is called so that the server drops the stream.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/batch_layout.h"
#include "core/draw_order.h"
#include "core/rate_limiter.h"
#include "core/replay_memory.h"
#include "core/status.h"
#include "core/stream_ring.h"

namespace memoire {

// Counts shared by the streams of one server socket (added to the server's stats).
struct StreamCounts {
  std::atomic<int64_t> batches{0};       // stream_batches
  std::atomic<int64_t> rows{0};          // rows_sampled
  std::atomic<int64_t> draw_errors{0};   // stream_draw_errors
  std::atomic<int64_t> rate_limited{0};  // stream_rate_limited
  std::atomic<int64_t> send_errors{0};   // stream_send_errors: rows messages not queued
  // A gauge, not a count: sampler threads waiting for their learner now (for credit, a slot,
  // or the learner to take what was drawn ahead). All of a stream's waiting means it draws
  // nothing more until its learner moves (stream_samplers_waiting).
  std::atomic<int64_t> waiting{0};
};

// Counts the calling thread in counts->waiting (null: nothing) while it lives.
class WaitingForLearner {
 public:
  explicit WaitingForLearner(StreamCounts* counts) : counts_(counts) {
    if (counts_ != nullptr) counts_->waiting.fetch_add(1);
  }
  ~WaitingForLearner() {
    if (counts_ != nullptr) counts_->waiting.fetch_sub(1);
  }
  WaitingForLearner(const WaitingForLearner&) = delete;
  WaitingForLearner& operator=(const WaitingForLearner&) = delete;

 private:
  StreamCounts* counts_;
};

// What both samplers do around a draw (core/stream_rows_sampler.h too):
// Asks `limiter` (null: none) for a batch of n rows without waiting. False when it holds the
// batch back (counted in counts->rate_limited); true otherwise, with *s the error of a batch
// its band can never allow (the draw then fails with it).
bool LimiterLets(RateLimiter* limiter, int64_t n, StreamCounts* counts, Status* s);
// Counts a finished draw in `counts` (null: none): a batch of n rows, or a draw error.
void CountDraw(StreamCounts* counts, bool ok, int64_t n);
// Makes *until at least `ms` milliseconds from now (a stream's pause).
inline void PauseAtLeast(std::chrono::steady_clock::time_point* until, int ms) {
  *until = std::max(*until, std::chrono::steady_clock::now() + std::chrono::milliseconds(ms));
}

class StreamSampler {
 public:
  struct Options {
    std::shared_ptr<ReplayMemory> memory;
    std::shared_ptr<RateLimiter> limiter;  // may be null
    BatchLayout layout;                    // with totals (StreamSlotLayout)
    int frame_stack = 1;                   // the slots' size: a change fails the draw
    uint8_t* control = nullptr;            // the ring's block (StreamRing::Init done)
    uint8_t* base = nullptr;               // slot s at base + s * layout.slot_bytes
    std::shared_ptr<const void> keep;      // keeps the mapping alive while threads run
    int64_t slots = 1;
    int64_t ahead = 0;  // batches drawn and not yet taken, at most (0: up to the slots)
    int threads = 1;
    int error_pause_ms = 50;   // after a failed draw the stream waits this long
    int limited_pause_ms = 2;  // a thread the limiter holds back waits this long
    std::shared_ptr<StreamCounts> counts;  // may be null
    std::function<void()> wake;  // called once a credit is refused
    int credit_wait_ms = 100;    // a thread with no free slot sleeps at most this (Stop wakes it)
  };

  // kInvalidArgument on bad options (kDataLoss on a control block without a ring); starts
  // the threads.
  static Status Make(Options o, std::unique_ptr<StreamSampler>* out);
  ~StreamSampler();  // Stop()
  StreamSampler(const StreamSampler&) = delete;
  StreamSampler& operator=(const StreamSampler&) = delete;

  // Joins the threads (a draw in progress completes; its outcome stays queued). Idempotent.
  void Stop();
  // Why the stream's draws stopped (a credit refused), empty while they go on.
  std::string refusal() const;
  // Seconds since the stream was created or its learner last gave slots back.
  double idle_seconds() const;

  int64_t slots() const { return opt_.slots; }
  int threads() const { return opt_.threads; }
  int64_t held() const;        // slots the learner has (drawn, not given back)
  int64_t drawn() const;       // successful draws so far
  int64_t given_back() const;  // slots given back so far

 private:
  // An outcome to publish, in draw order: a batch or a failed draw (error_bytes > 0, its
  // reason in the slot); either way `slot` is then the learner's.
  struct Outcome {
    int64_t slot = -1;
    int64_t error_bytes = 0;
  };
  explicit StreamSampler(Options o);
  void Run();
  void Touch();
  // Frees the slots the learner gave back (or refuses the credit); mu_ held.
  void TakeCreditsLocked();
  // Publishes the finished outcomes at the front of ready_; true if any; mu_ held.
  bool PublishLocked();
  using Clock = std::chrono::steady_clock;

  const Options opt_;
  mutable std::mutex mu_;  // guards everything below but the atomics
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<int64_t> free_;  // a stack: back is written next
  std::vector<uint8_t> held_;  // per slot: the learner's
  StreamRing ring_;             // the server's end; its calls under mu_ but WaitLearner
  std::vector<int64_t> credits_;  // TakeCreditsLocked's scratch
  std::string refusal_;
  int64_t num_held_ = 0;
  int64_t in_flight_ = 0;  // slots claimed by a thread whose outcome is not published yet
  int64_t given_back_ = 0;
  Clock::time_point paused_until_{};
  DrawOrder<Outcome> ready_;  // the finished front ones are published
  int64_t next_seq_ = 0;
  std::atomic<int64_t> drawn_{0};
  std::atomic<int64_t> last_seen_ns_{0};
  std::vector<std::thread> threads_;
};

}  // namespace memoire
