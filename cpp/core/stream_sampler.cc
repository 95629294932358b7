#include "core/stream_sampler.h"

#include <algorithm>
#include <cstring>

#include "core/batch_scheduling.h"
#include "core/thread_name.h"

namespace memoire {

bool LimiterLets(RateLimiter* limiter, int64_t n, StreamCounts* counts, Status* s) {
  if (limiter == nullptr) return true;
  bool granted = false;
  *s = limiter->AwaitSample(n, 0.0, &granted);
  if (!s->ok() || granted) return true;
  if (counts != nullptr) counts->rate_limited.fetch_add(1);
  return false;
}

void CountDraw(StreamCounts* counts, bool ok, int64_t n) {
  if (counts == nullptr) return;
  if (ok) {
    counts->batches.fetch_add(1);
    counts->rows.fetch_add(n);
  } else {
    counts->draw_errors.fetch_add(1);
  }
}

Status StreamSampler::Make(Options o, std::unique_ptr<StreamSampler>* out) {
  if (!o.memory) return Error(Code::kInvalidArgument, "stream sampler: no memory");
  if (o.base == nullptr || o.control == nullptr)
    return Error(Code::kInvalidArgument, "stream sampler: no slots");
  if (o.slots < 1 || o.threads < 1 || o.threads > 256)
    return Error(Code::kInvalidArgument, "stream sampler: expected slots >= 1 and threads in "
                 "[1, 256], got ", o.slots, " and ", o.threads);
  if (o.layout.batch_size() < 1 || o.layout.slot_bytes < StreamRing::kMaxErrorBytes)
    return Error(Code::kInvalidArgument, "stream sampler: expected a batch layout");
  if (o.ahead < 0)
    return Error(Code::kInvalidArgument, "stream sampler: expected ahead >= 0, got ", o.ahead);
  if (o.credit_wait_ms < 1)
    return Error(Code::kInvalidArgument, "stream sampler: expected credit_wait_ms >= 1");
  if (o.ahead == 0) o.ahead = o.slots;
  std::unique_ptr<StreamSampler> s(new StreamSampler(std::move(o)));
  MEMOIRE_RETURN_IF_ERROR(StreamRing::Attach(s->opt_.control, s->opt_.slots, &s->ring_));
  for (int t = 0; t < s->opt_.threads; ++t) {
    s->threads_.emplace_back([p = s.get()] { p->Run(); });
    NameThread(s->threads_.back(), "memoire-stream");
  }
  *out = std::move(s);
  return Status::OK();
}

StreamSampler::StreamSampler(Options o)
    : opt_(std::move(o)), held_(static_cast<size_t>(opt_.slots), 0) {
  // Slot 0 is written first, then 1, ... (until slots come back).
  for (int64_t s = opt_.slots - 1; s >= 0; --s) free_.push_back(s);
  Touch();
}

StreamSampler::~StreamSampler() { Stop(); }

void StreamSampler::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (ring_.capacity() > 0) ring_.WakeServerWaiters();  // threads asleep on the ring
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
}

void StreamSampler::Touch() {
  last_seen_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                          Clock::now().time_since_epoch()).count());
}

double StreamSampler::idle_seconds() const {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          Clock::now().time_since_epoch()).count();
  return static_cast<double>(now - last_seen_ns_.load()) * 1e-9;
}

int64_t StreamSampler::held() const {
  std::lock_guard<std::mutex> l(mu_);
  return num_held_;
}
int64_t StreamSampler::drawn() const { return drawn_.load(); }
int64_t StreamSampler::given_back() const {
  std::lock_guard<std::mutex> l(mu_);
  return given_back_;
}

std::string StreamSampler::refusal() const {
  std::lock_guard<std::mutex> l(mu_);
  return refusal_;
}

void StreamSampler::TakeCreditsLocked() {
  if (!refusal_.empty()) return;
  credits_.clear();
  Status s = ring_.TakeCredits(&credits_);
  for (size_t i = 0; s.ok() && i < credits_.size(); ++i) {
    const int64_t slot = credits_[i];
    if (slot < 0 || slot >= opt_.slots || !held_[slot]) {
      s = Error(Code::kInvalidArgument, "stream: slot ", slot, " is not the learner's to give "
                "back (", opt_.slots, " slots)");
      break;
    }
    held_[slot] = 0;
    free_.push_back(slot);
    --num_held_;
    ++given_back_;
  }
  if (!credits_.empty()) Touch();
  if (!s.ok()) {
    // Not an honest learner: this stream draws no more; the server drops it (wake).
    refusal_ = s.message();
    cv_.notify_all();
    if (opt_.wake) opt_.wake();
  }
}

bool StreamSampler::PublishLocked() {
  // Batches are numbered here, in draw order, so seq counts successful draws without gaps
  // (a draw whose copy failed is a failed outcome, as one that found nothing to draw).
  return ready_.TakeFinished([&](const Outcome& o) {
           ring_.PublishNotice(o.error_bytes > 0 ? -1 : next_seq_++, o.slot, o.error_bytes);
           --in_flight_;
         }) > 0;
}

void StreamSampler::Run() {
  SetBatchScheduling(true);
  const int64_t n = opt_.layout.batch_size();
  std::vector<uint8_t*> parts(opt_.layout.parts.size());
  while (true) {
    int64_t slot;
    {
      std::unique_lock<std::mutex> l(mu_);
      while (true) {
        if (stop_) return;
        // Read before looking: a learner's move after this makes WaitLearner return at once.
        const uint32_t events = ring_.learner_events();
        TakeCreditsLocked();
        if (!refusal_.empty()) {
          cv_.wait(l);  // until Stop
          continue;
        }
        if (Clock::now() < paused_until_) {
          cv_.wait_until(l, paused_until_);
          continue;
        }
        if (!free_.empty() && ring_.Untaken() + in_flight_ < opt_.ahead) break;
        l.unlock();
        {
          WaitingForLearner waiting(opt_.counts.get());
          ring_.WaitLearner(events, opt_.credit_wait_ms);
        }
        l.lock();
      }
      slot = free_.back();
      free_.pop_back();
      ++in_flight_;
    }
    Status s;
    if (!LimiterLets(opt_.limiter.get(), n, opt_.counts.get(), &s)) {
      // Held back: the slot stays first in line; the stream waits a little.
      {
        std::lock_guard<std::mutex> l(mu_);
        free_.push_back(slot);
        --in_flight_;
        PauseAtLeast(&paused_until_, opt_.limited_pause_ms);
      }
      cv_.notify_all();
      continue;
    }
    // The outcome takes its place in ready_ at the draw (in the memory's draw order) and is
    // filled in once the copy is done: copies of several threads overlap, notices keep the
    // draw order (core/draw_order.h).
    DrawOrder<Outcome>::Entry* placed = nullptr;
    if (s.ok()) {  // else the limiter refused a batch its band can never allow
      opt_.layout.PartsAt(opt_.base + static_cast<size_t>(slot) * opt_.layout.slot_bytes,
                          parts.data());
      ReplayMemory::SampleOut out;
      opt_.layout.Point(parts.data(), &out);
      out.frame_stack = opt_.frame_stack;
      out.on_draw = [&] {
        std::lock_guard<std::mutex> l(mu_);
        placed = ready_.Place();
      };
      s = opt_.memory->Sample(n, out);
    }
    int64_t error_bytes = 0;
    if (!s.ok()) {
      // The slot is spent either way: it carries the reason to the learner.
      std::string reason = s.message();
      if (reason.empty()) reason = "the draw failed";
      error_bytes = static_cast<int64_t>(std::min(reason.size(), StreamRing::kMaxErrorBytes));
      std::memcpy(opt_.base + static_cast<size_t>(slot) * opt_.layout.slot_bytes, reason.data(),
                  static_cast<size_t>(error_bytes));
    }
    // Counted before the notice goes out: a learner that has taken a batch's notice finds it
    // in the counts (stream_hub_test read them after its last notice and, on a busy machine,
    // sometimes before this thread had counted).
    if (s.ok()) drawn_.fetch_add(1);
    CountDraw(opt_.counts.get(), s.ok(), n);
    bool published;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (placed == nullptr) placed = ready_.Place();  // no draw (failed, refused): queued now
      placed->value.slot = slot;
      placed->value.error_bytes = error_bytes;
      // Nothing to sample yet, most likely: the stream's threads wait a while.
      if (!s.ok()) PauseAtLeast(&paused_until_, opt_.error_pause_ms);
      placed->finished = true;
      held_[slot] = 1;
      ++num_held_;
      published = PublishLocked();
    }
    if (published) ring_.WakeNoticeWaiters();
  }
}

}  // namespace memoire
