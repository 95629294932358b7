// StreamSampler: the server's end of one shared-memory sampling stream (core/stream_batch.h).
// N threads each take a free slot, ask the server's rate limiter, draw a batch from the memory
// straight into the slot in the learner's layout (core/batch_layout.h) and queue its outcome
// (a batch, or a failed draw that spent the slot); the server's I/O thread sends the queued
// outcomes as notices (PopReady) and hands back the slots the learner returns (GiveBack).
// Nothing here takes the GIL or touches a socket.
//
// Order: each draw takes its place in the outcome queue at the moment the memory draws it,
// under the memory's draw lock (ReplayMemory::SampleOut::on_draw), and batches are numbered
// as they leave the queue's front, finished, so batch seq k is the stream's k-th successful
// draw from the memory and the outcomes leave in draw order whatever the number of threads.
// The copies themselves overlap: Sample holds the memory's lock shared (writers wait; other
// samplers copy alongside), so N threads copy N batches at once. When the stream is the
// memory's only sampler, its batch seq k is the k-th batch get_batch would draw with the same
// seed and contents, for any number of threads.
//
// Slots: every slot is free (the server's) at start; a drawn slot is the learner's (held)
// until GiveBack; the slot freed last is written first (its lines are likelier in cache).
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/batch_layout.h"
#include "core/rate_limiter.h"
#include "core/replay_memory.h"
#include "core/status.h"

namespace memoire {

// Counts shared by the streams of one server socket (added to the server's stats).
struct StreamCounts {
  std::atomic<int64_t> batches{0};       // stream_batches
  std::atomic<int64_t> rows{0};          // rows_sampled
  std::atomic<int64_t> draw_errors{0};   // stream_draw_errors
  std::atomic<int64_t> rate_limited{0};  // stream_rate_limited
};

class StreamSampler {
 public:
  struct Options {
    std::shared_ptr<ReplayMemory> memory;
    std::shared_ptr<RateLimiter> limiter;  // may be null
    BatchLayout layout;                    // with totals (StreamSlotLayout)
    int frame_stack = 1;                   // the slots' size: a change fails the draw
    uint8_t* base = nullptr;               // slot s at base + s * layout.slot_bytes
    std::shared_ptr<const void> keep;      // keeps the mapping alive while threads run
    int64_t slots = 1;
    int threads = 1;
    int error_pause_ms = 50;   // after a failed draw the stream waits this long
    int limited_pause_ms = 2;  // a thread the limiter holds back waits this long
    std::shared_ptr<StreamCounts> counts;  // may be null
    std::function<void()> wake;  // called (no lock held) after an outcome is queued
  };
  // An outcome to send, in draw order: a batch (error empty) or a failed draw; either way
  // `slot` is now the learner's.
  struct Outcome {
    int64_t seq = -1;  // the batch's number (-1 for a failed draw)
    int64_t slot = -1;
    std::string error;
    bool finished = false;  // queued at the draw, finished after the copy (internal)
  };

  // kInvalidArgument on bad options; starts the threads.
  static Status Make(Options o, std::unique_ptr<StreamSampler>* out);
  ~StreamSampler();  // Stop()
  StreamSampler(const StreamSampler&) = delete;
  StreamSampler& operator=(const StreamSampler&) = delete;

  // Joins the threads (a draw in progress completes; its outcome stays queued). Idempotent.
  void Stop();
  // The learner gives back k slots: kInvalidArgument, changing nothing, unless they are k >= 1
  // distinct slots in [0, slots) that the learner holds.
  Status GiveBack(const int64_t* slots, int64_t k);
  // Appends the queued outcomes, in draw order, to *out.
  void PopReady(std::vector<Outcome>* out);
  // Seconds since the stream was created or last gave slots back (Touch).
  double idle_seconds() const;
  void Touch();

  int64_t slots() const { return opt_.slots; }
  int threads() const { return opt_.threads; }
  int64_t held() const;        // slots the learner has (drawn, not given back)
  int64_t drawn() const;       // successful draws so far
  int64_t given_back() const;  // slots given back so far

 private:
  explicit StreamSampler(Options o);
  void Run();
  using Clock = std::chrono::steady_clock;

  const Options opt_;
  mutable std::mutex mu_;  // guards everything below but the atomics
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<int64_t> free_;  // a stack: back is written next
  std::vector<uint8_t> held_;  // per slot: the learner's
  int64_t num_held_ = 0;
  int64_t given_back_ = 0;
  Clock::time_point paused_until_{};
  std::deque<Outcome> ready_;  // in draw order; the finished front ones are sent
  int64_t next_seq_ = 0;
  std::atomic<int64_t> drawn_{0};
  std::atomic<int64_t> last_seen_ns_{0};
  std::vector<std::thread> threads_;
};

}  // namespace memoire
