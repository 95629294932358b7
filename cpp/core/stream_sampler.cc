#include "core/stream_sampler.h"

#include <algorithm>

namespace memoire {

Status StreamSampler::Make(Options o, std::unique_ptr<StreamSampler>* out) {
  if (!o.memory) return Error(Code::kInvalidArgument, "stream sampler: no memory");
  if (o.base == nullptr) return Error(Code::kInvalidArgument, "stream sampler: no slots");
  if (o.slots < 1 || o.threads < 1 || o.threads > 256)
    return Error(Code::kInvalidArgument, "stream sampler: expected slots >= 1 and threads in "
                 "[1, 256], got ", o.slots, " and ", o.threads);
  if (o.layout.batch_size() < 1)
    return Error(Code::kInvalidArgument, "stream sampler: expected a batch layout");
  std::unique_ptr<StreamSampler> s(new StreamSampler(std::move(o)));
  for (int t = 0; t < s->opt_.threads; ++t) s->threads_.emplace_back([p = s.get()] { p->Run(); });
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

Status StreamSampler::GiveBack(const int64_t* slots, int64_t k) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (k < 1)
      return Error(Code::kInvalidArgument, "stream: expected k >= 1 slots given back, got ", k);
    // Every slot is checked before any is taken back: a bad credit changes nothing.
    std::vector<int64_t> seen(slots, slots + k);
    std::sort(seen.begin(), seen.end());
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
      return Error(Code::kInvalidArgument, "stream: a slot given back twice in one credit");
    for (int64_t i = 0; i < k; ++i)
      if (slots[i] < 0 || slots[i] >= opt_.slots || !held_[slots[i]])
        return Error(Code::kInvalidArgument, "stream: slot ", slots[i],
                     " is not the learner's to give back (", opt_.slots, " slots)");
    for (int64_t i = 0; i < k; ++i) {
      held_[slots[i]] = 0;
      free_.push_back(slots[i]);
    }
    num_held_ -= k;
    given_back_ += k;
  }
  Touch();
  cv_.notify_all();
  return Status::OK();
}

void StreamSampler::PopReady(std::vector<Outcome>* out) {
  std::lock_guard<std::mutex> l(mu_);
  // Batches are numbered here, in draw order, so seq counts successful draws without gaps
  // (a draw whose copy failed is a failed outcome, as one that found nothing to draw).
  while (!ready_.empty() && ready_.front().finished) {
    Outcome& o = ready_.front();
    if (o.error.empty()) o.seq = next_seq_++;
    out->push_back(std::move(o));
    ready_.pop_front();
  }
}

void StreamSampler::Run() {
  const int64_t n = opt_.layout.batch_size();
  std::vector<uint8_t*> parts(opt_.layout.parts.size());
  while (true) {
    int64_t slot;
    {
      std::unique_lock<std::mutex> l(mu_);
      while (true) {
        if (stop_) return;
        if (Clock::now() < paused_until_) {
          cv_.wait_until(l, paused_until_);
          continue;
        }
        if (!free_.empty()) break;
        cv_.wait(l);
      }
      slot = free_.back();
      free_.pop_back();
    }
    Status s;
    if (opt_.limiter) {
      bool granted = false;
      s = opt_.limiter->AwaitSample(n, 0.0, &granted);
      if (s.ok() && !granted) {
        // Held back: the slot stays first in line; the stream waits a little.
        {
          std::lock_guard<std::mutex> l(mu_);
          free_.push_back(slot);
          paused_until_ = std::max(paused_until_, Clock::now() +
                                   std::chrono::milliseconds(opt_.limited_pause_ms));
        }
        if (opt_.counts) opt_.counts->rate_limited.fetch_add(1);
        cv_.notify_all();
        continue;
      }
    }
    // The outcome takes its place in ready_ at the draw (in the memory's draw order) and is
    // filled in once the copy is done: copies of several threads overlap, notices keep the
    // draw order (PopReady hands out only finished outcomes from the front).
    Outcome* placed = nullptr;
    if (s.ok()) {  // else the limiter refused a batch its band can never allow
      opt_.layout.PartsAt(opt_.base + static_cast<size_t>(slot) * opt_.layout.slot_bytes,
                          parts.data());
      ReplayMemory::SampleOut out;
      opt_.layout.Point(parts.data(), &out);
      out.frame_stack = opt_.frame_stack;
      out.on_draw = [&] {
        std::lock_guard<std::mutex> l(mu_);
        ready_.emplace_back();
        placed = &ready_.back();  // stays valid: PopReady never pops an unfinished outcome
      };
      s = opt_.memory->Sample(n, out);
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      if (placed == nullptr) {  // no draw (it failed, or was refused): queued now
        ready_.emplace_back();
        placed = &ready_.back();
      }
      placed->slot = slot;
      if (!s.ok()) {
        placed->error = s.message();
        // Nothing to sample yet, most likely: the stream's threads wait a while.
        paused_until_ = std::max(paused_until_, Clock::now() +
                                 std::chrono::milliseconds(opt_.error_pause_ms));
      }
      placed->finished = true;
      held_[slot] = 1;
      ++num_held_;
    }
    if (s.ok()) {
      drawn_.fetch_add(1);
      if (opt_.counts) {
        opt_.counts->batches.fetch_add(1);
        opt_.counts->rows.fetch_add(n);
      }
    } else if (opt_.counts) {
      opt_.counts->draw_errors.fetch_add(1);
    }
    if (opt_.wake) opt_.wake();
  }
}

}  // namespace memoire
