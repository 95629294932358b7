// StreamRowsSampler: the server's end of one sampling stream whose rows travel in the messages
// (a learner on another host, or one without shared memory; core/stream_batch.h). N threads
// each take a credit, ask the server's rate limiter, draw a batch of distinct rows
// (ReplayMemory::SampleDistinct) into a batch of their own and queue it, finished, for the
// socket's thread, which sends it (TakeReady, then EncodeStreamBatch). A failed draw spends its
// credit too: it is queued as its reason (the learner's next batch is that error) and the
// stream's threads pause. Nothing here takes the GIL or touches a socket.
//
// Order, as StreamSampler's (core/stream_sampler.h): each draw takes its place in the outcome
// queue at the moment the memory draws it (SampleDistinct's on_draw, under the memory's draw
// lock), and outcomes leave the queue's front finished, numbered in that order: batch seq k is
// the stream's k-th successful draw from the memory whatever the number of threads, while
// the copies of several threads overlap.
//
// Credit: the learner grants batches (at open, then one credit per batch it has read); the
// threads draw only against credit, so the batches drawn, queued or in flight to the learner
// never exceed what it granted (outstanding() counts them until TakeReady hands them out).
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <array>
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

#include "core/draw_order.h"
#include "core/protocol.h"
#include "core/rate_limiter.h"
#include "core/replay_memory.h"
#include "core/status.h"
#include "core/stream_batch.h"
#include "core/stream_sampler.h"

namespace memoire {

class StreamRowsSampler {
 public:
  struct Options {
    std::shared_ptr<ReplayMemory> memory;
    std::shared_ptr<RateLimiter> limiter;  // may be null
    int64_t batch_size = 1;
    int window = 0;  // the stream's window, agreed at open (a change fails the draw)
    std::array<uint8_t, protocol::kNumFields> send{};  // the fields whose rows travel
    bool compressed_state = false;  // states as the memory stores them (StreamBatch's)
    int64_t credit = 1;  // batches granted at open
    int threads = 1;
    int error_pause_ms = 50;   // after a failed draw the stream waits this long
    int limited_pause_ms = 2;  // a thread the limiter holds back waits this long
    std::shared_ptr<StreamCounts> counts;  // may be null
    std::function<void()> ready;  // called when outcomes are ready for TakeReady
  };
  // A batch to send (batch set, numbered) or a failed draw (batch null, its reason in error).
  struct Outcome {
    std::shared_ptr<StreamBatch> batch;
    std::string error;
  };

  // kInvalidArgument on bad options; starts the threads.
  static Status Make(Options o, std::unique_ptr<StreamRowsSampler>* out);
  ~StreamRowsSampler();  // Stop()
  StreamRowsSampler(const StreamRowsSampler&) = delete;
  StreamRowsSampler& operator=(const StreamRowsSampler&) = delete;

  // Joins the threads (a draw in progress completes). Idempotent.
  void Stop();
  // `k` more batches may be drawn (k >= 0; the caller bounds outstanding()).
  void Grant(int64_t k);
  // Credit granted and not yet handed out by TakeReady: undrawn, drawing, or queued.
  int64_t outstanding() const;
  // Appends the finished outcomes, in draw order, to *out and forgets them.
  void TakeReady(std::vector<Outcome>* out);
  int threads() const { return opt_.threads; }

 private:
  explicit StreamRowsSampler(Options o);
  void Run();
  using Clock = std::chrono::steady_clock;

  const Options opt_;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t credit_ = 0;     // granted, not yet claimed by a thread
  int64_t in_flight_ = 0;  // claimed, not yet finished
  Clock::time_point paused_until_{};
  DrawOrder<Outcome> pending_;  // the finished front ones move to ready_
  std::vector<Outcome> ready_;   // finished, in order, for TakeReady
  int64_t next_seq_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace memoire
