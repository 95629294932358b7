#include "core/rate_limiter.h"

#include <chrono>
#include <cmath>
#include <sstream>

namespace memoire {

Status RateLimiter::Make(const Options& o, std::unique_ptr<RateLimiter>* out) {
  if (!(std::isfinite(o.samples_per_insert) && o.samples_per_insert > 0))
    return Error(Code::kInvalidArgument, "samples_per_insert: expected a finite ratio > 0, got " +
                                             std::to_string(o.samples_per_insert));
  if (o.min_size_to_sample < 1)
    return Error(Code::kInvalidArgument, "min_size_to_sample: expected >= 1, got " +
                                             std::to_string(o.min_size_to_sample));
  if (!(o.min_diff < o.max_diff))  // also false for NaN
    return Error(Code::kInvalidArgument, "error band: expected min_diff < max_diff, got [" +
                                             std::to_string(o.min_diff) + ", " +
                                             std::to_string(o.max_diff) + "]");
  out->reset(new RateLimiter(o));
  return Status::OK();
}

bool RateLimiter::CanInsertLocked(int64_t n) const {
  if (counts_.inserts + n <= opt_.min_size_to_sample) return true;  // filling up: free
  return double(counts_.inserts + n) * opt_.samples_per_insert - double(counts_.samples) <=
         opt_.max_diff;
}

bool RateLimiter::CanSampleLocked(int64_t n) const {
  if (counts_.inserts < opt_.min_size_to_sample) return false;
  return double(counts_.inserts) * opt_.samples_per_insert - double(counts_.samples) -
             double(n) >= opt_.min_diff;
}

bool RateLimiter::CanInsert(int64_t n) const {
  std::lock_guard<std::mutex> l(mu_);
  return CanInsertLocked(n);
}

bool RateLimiter::CanSample(int64_t n) const {
  std::lock_guard<std::mutex> l(mu_);
  return CanSampleLocked(n);
}

template <typename Ready>
bool RateLimiter::WaitLocked(std::unique_lock<std::mutex>& l, std::condition_variable& cv,
                             double timeout, Ready ready, double* waited) {
  *waited = 0;
  if (cancelled_) return false;
  if (ready()) return true;
  if (!(timeout > 0)) return false;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  // Infinite or huge timeouts: wait in one-hour slices (no overflow of the deadline).
  const double slice_cap = 3600.0;
  bool ok = false;
  while (true) {
    const double left = timeout - std::chrono::duration<double>(Clock::now() - start).count();
    if (left <= 0) break;
    cv.wait_for(l, std::chrono::duration<double>(std::min(left, slice_cap)));
    if (cancelled_) break;
    if (ready()) {
      ok = true;
      break;
    }
  }
  *waited = std::chrono::duration<double>(Clock::now() - start).count();
  return ok;
}

Status RateLimiter::AwaitSample(int64_t n, double timeout, bool* granted) {
  *granted = false;
  if (n < 1) return Error(Code::kInvalidArgument, "sample: expected n >= 1, got " + std::to_string(n));
  if (double(n) > (opt_.max_diff - opt_.min_diff) - opt_.samples_per_insert)
    return Error(Code::kInvalidArgument,
                 "sample: a batch of " + std::to_string(n) +
                     " can never be drawn within the rate limiter's band (max_diff - min_diff "
                     "- samples_per_insert = " +
                     std::to_string((opt_.max_diff - opt_.min_diff) - opt_.samples_per_insert) +
                     "): widen error_buffer or sample smaller batches");
  std::unique_lock<std::mutex> l(mu_);
  ++counts_.samples_waiting;
  double waited = 0;
  const bool ok = WaitLocked(l, sample_cv_, timeout, [&] { return CanSampleLocked(n); }, &waited);
  --counts_.samples_waiting;
  if (waited > 0) {
    ++counts_.sample_blocked;
    counts_.sample_blocked_s += waited;
  }
  if (!ok) {
    if (timeout > 0 && !cancelled_) ++counts_.sample_timeouts;
    return Status::OK();
  }
  counts_.samples += n;
  *granted = true;
  if (CanInsertLocked(1)) insert_cv_.notify_all();
  return Status::OK();
}

bool RateLimiter::WaitCanSample(int64_t n, double timeout) {
  std::unique_lock<std::mutex> l(mu_);
  double waited = 0;
  return WaitLocked(l, sample_cv_, timeout, [&] { return CanSampleLocked(n); }, &waited);
}

bool RateLimiter::AwaitInsert(double timeout) {
  std::unique_lock<std::mutex> l(mu_);
  ++counts_.inserts_waiting;
  double waited = 0;
  const bool ok = WaitLocked(l, insert_cv_, timeout, [&] { return CanInsertLocked(1); }, &waited);
  --counts_.inserts_waiting;
  if (waited > 0) {
    ++counts_.insert_blocked;
    counts_.insert_blocked_s += waited;
  }
  if (!ok && timeout > 0 && !cancelled_) ++counts_.insert_timeouts;
  return ok;
}

void RateLimiter::Inserted(int64_t n) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> l(mu_);
  counts_.inserts += n;
  if (CanSampleLocked(1)) sample_cv_.notify_all();
}

void RateLimiter::RecordSampleWait(double seconds, bool timed_out) {
  std::lock_guard<std::mutex> l(mu_);
  if (seconds > 0) {
    ++counts_.sample_blocked;
    counts_.sample_blocked_s += seconds;
  }
  if (timed_out) ++counts_.sample_timeouts;
}

void RateLimiter::Cancel() {
  std::lock_guard<std::mutex> l(mu_);
  cancelled_ = true;
  insert_cv_.notify_all();
  sample_cv_.notify_all();
}

RateLimiter::Counters RateLimiter::counters() const {
  std::lock_guard<std::mutex> l(mu_);
  return counts_;
}

std::string RateLimiter::DescribeLocked() const {
  std::ostringstream s;
  s << "inserts=" << counts_.inserts << " samples=" << counts_.samples
    << " cursor=" << double(counts_.inserts) * opt_.samples_per_insert - double(counts_.samples)
    << " band=[" << opt_.min_diff << ", " << opt_.max_diff << "]"
    << " min_size_to_sample=" << opt_.min_size_to_sample
    << " samples_per_insert=" << opt_.samples_per_insert;
  if (cancelled_) s << " cancelled";
  return s.str();
}

std::string RateLimiter::Describe() const {
  std::lock_guard<std::mutex> l(mu_);
  return DescribeLocked();
}

}  // namespace memoire
