// RateLimiter: keeps the ratio of samples to inserts of a replay memory within a band, with
// Reverb's semantics (reverb/cc/rate_limiter.cc, reverb/rate_limiters.py), so that a run's
// replay ratio does not depend on how many actors write how fast.
//
// With I transitions inserted and S transitions sampled (a batch of B counts B), the limiter
// tracks the "cursor" d = I * samples_per_insert - S and:
//   - sampling n transitions may proceed when I >= min_size_to_sample and d - n >= min_diff;
//   - inserting n transitions may proceed when I + n <= min_size_to_sample (the first
//     min_size_to_sample inserts are free), or when (I + n) * samples_per_insert - S <= max_diff.
// A sampler waits (AwaitSample) until it may proceed and counts its samples in the same step;
// an inserter waits (AwaitInsert) before it takes more data and counts what it stored
// afterwards (Inserted), because the store takes a whole episode whose length is known only
// once its last chunk has arrived: d may go past max_diff by at most one episode's
// rows * samples_per_insert.
//
// Reverb counts the table's size as inserts - deletes; memoire's memories evict only when full,
// so the size test uses I alone (a memory that once held min_size_to_sample transitions never
// drops below it again, given min_size_to_sample <= capacity, which the owner checks).
//
// A batch of n can never be drawn when n > (max_diff - min_diff) - samples_per_insert: both
// sides would block for ever. AwaitSample refuses such an n (kInvalidArgument).
//
// Thread safety: thread-safe; waits release nothing but the limiter's own mutex (callers
// release the GIL around them). Cancel wakes every wait (they return false).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"

namespace memoire {

class RateLimiter {
 public:
  struct Options {
    double samples_per_insert = 1.0;  // > 0, finite
    int64_t min_size_to_sample = 1;   // >= 1
    double min_diff = -1.7976931348623157e308;  // the band of the cursor d (min_diff < max_diff)
    double max_diff = 1.7976931348623157e308;
  };
  // What the limiter did, for a server's stats. Times in seconds.
  struct Counters {
    int64_t inserts = 0, samples = 0;
    int64_t insert_blocked = 0, sample_blocked = 0;    // calls that waited at all
    int64_t insert_timeouts = 0, sample_timeouts = 0;  // calls that gave up
    double insert_blocked_s = 0, sample_blocked_s = 0; // total time those calls waited
    int64_t inserts_waiting = 0, samples_waiting = 0;  // calls waiting now
  };

  // Fails (kInvalidArgument) on a ratio that is not finite and > 0, min_size_to_sample < 1,
  // or a band that is NaN or empty (min_diff >= max_diff).
  static Status Make(const Options& options, std::unique_ptr<RateLimiter>* out);

  bool CanInsert(int64_t n) const;
  bool CanSample(int64_t n) const;

  // Waits up to `timeout` seconds (infinite allowed; 0: no wait) until `n` transitions may be
  // sampled, then counts them. Returns false on timeout or Cancel (nothing counted).
  // kInvalidArgument: n < 1, or n larger than the band can ever allow (see above).
  Status AwaitSample(int64_t n, double timeout, bool* granted);
  // Waits up to `timeout` seconds until `n` transitions could be sampled; counts nothing and
  // records no blocked time (for a caller that defers work and counts with AwaitSample(n, 0)).
  bool WaitCanSample(int64_t n, double timeout);
  // Waits up to `timeout` seconds until one transition may be inserted; counts nothing (call
  // Inserted once the data is stored). Returns false on timeout or Cancel.
  bool AwaitInsert(double timeout);
  // Counts `n` stored transitions and wakes waiters.
  void Inserted(int64_t n);
  // Adds time a caller spent waiting for the sample side outside AwaitSample (a deferred
  // request), and whether it gave up.
  void RecordSampleWait(double seconds, bool timed_out);

  // Wakes every wait, which return false, and makes later waits return false at once.
  void Cancel();

  Options options() const { return opt_; }
  Counters counters() const;
  // "inserts=I samples=S cursor=d band=[min, max] min_size_to_sample=m samples_per_insert=r":
  // the state, for error messages.
  std::string Describe() const;

 private:
  explicit RateLimiter(const Options& options) : opt_(options) {}
  bool CanInsertLocked(int64_t n) const;
  bool CanSampleLocked(int64_t n) const;
  std::string DescribeLocked() const;
  // Waits on `cv` until `ready()` or the deadline or Cancel; true when ready.
  template <typename Ready>
  bool WaitLocked(std::unique_lock<std::mutex>& l, std::condition_variable& cv, double timeout,
                  Ready ready, double* waited);

  const Options opt_;
  mutable std::mutex mu_;
  std::condition_variable insert_cv_, sample_cv_;
  Counters counts_;  // guarded by mu_
  bool cancelled_ = false;  // guarded by mu_
};

}  // namespace memoire
