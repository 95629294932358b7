#include "core/stream_rows_sampler.h"

#include <algorithm>

#include "core/batch_scheduling.h"

namespace memoire {

Status StreamRowsSampler::Make(Options o, std::unique_ptr<StreamRowsSampler>* out) {
  if (!o.memory) return Error(Code::kInvalidArgument, "stream rows sampler: no memory");
  if (o.batch_size < 1 || o.credit < 0 || o.threads < 1 || o.threads > 256)
    return Error(Code::kInvalidArgument, "stream rows sampler: expected batch_size >= 1, "
                 "credit >= 0 and threads in [1, 256], got ", o.batch_size, ", ", o.credit,
                 " and ", o.threads);
  std::unique_ptr<StreamRowsSampler> s(new StreamRowsSampler(std::move(o)));
  for (int t = 0; t < s->opt_.threads; ++t) s->threads_.emplace_back([p = s.get()] { p->Run(); });
  *out = std::move(s);
  return Status::OK();
}

StreamRowsSampler::StreamRowsSampler(Options o) : opt_(std::move(o)), credit_(opt_.credit) {}

StreamRowsSampler::~StreamRowsSampler() { Stop(); }

void StreamRowsSampler::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
}

void StreamRowsSampler::Grant(int64_t k) {
  if (k <= 0) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    credit_ += k;
  }
  cv_.notify_all();
}

int64_t StreamRowsSampler::outstanding() const {
  std::lock_guard<std::mutex> l(mu_);
  return credit_ + in_flight_ + static_cast<int64_t>(ready_.size());
}

void StreamRowsSampler::TakeReady(std::vector<Outcome>* out) {
  std::lock_guard<std::mutex> l(mu_);
  for (Outcome& o : ready_) out->push_back(std::move(o));
  ready_.clear();
}

void StreamRowsSampler::Run() {
  SetBatchScheduling(true);  // background work: the learner's process may share this host
  const int64_t n = opt_.batch_size;
  while (true) {
    {
      std::unique_lock<std::mutex> l(mu_);
      while (true) {
        if (stop_) return;
        if (Clock::now() < paused_until_) {
          cv_.wait_until(l, paused_until_);
          continue;
        }
        if (credit_ > 0) break;
        cv_.wait(l);
      }
      --credit_;
      ++in_flight_;
    }
    Status s;
    if (opt_.limiter) {
      bool granted = false;
      s = opt_.limiter->AwaitSample(n, 0.0, &granted);
      if (s.ok() && !granted) {
        // Held back: the credit goes back; the stream waits a little.
        {
          std::lock_guard<std::mutex> l(mu_);
          ++credit_;
          --in_flight_;
          paused_until_ = std::max(paused_until_, Clock::now() +
                                   std::chrono::milliseconds(opt_.limited_pause_ms));
        }
        if (opt_.counts) opt_.counts->rate_limited.fetch_add(1);
        cv_.notify_all();
        continue;
      }
    }
    auto batch = std::make_shared<StreamBatch>();
    Pending* placed = nullptr;
    if (s.ok()) {  // else the limiter refused a batch its band can never allow
      batch->window = opt_.window;
      batch->send = opt_.send;
      batch->compressed_state = opt_.compressed_state;
      s = opt_.memory->SampleDistinct(n, batch.get(), [&] {
        std::lock_guard<std::mutex> l(mu_);
        pending_.emplace_back();
        placed = &pending_.back();  // stays valid: only finished ones leave the front
      });
    }
    bool any_ready = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (placed == nullptr) {  // no draw (it failed, or was refused): queued now
        pending_.emplace_back();
        placed = &pending_.back();
      }
      if (s.ok()) {
        placed->outcome.batch = std::move(batch);
      } else {
        placed->outcome.error = s.message().empty() ? "the draw failed" : s.message();
        // Nothing to sample yet, most likely: the stream's threads wait a while.
        paused_until_ = std::max(paused_until_, Clock::now() +
                                 std::chrono::milliseconds(opt_.error_pause_ms));
      }
      placed->finished = true;
      // Numbered as they leave in draw order, so seq counts successful draws without gaps.
      while (!pending_.empty() && pending_.front().finished) {
        Outcome& o = pending_.front().outcome;
        if (o.batch) o.batch->seq = next_seq_++;
        ready_.push_back(std::move(o));
        pending_.pop_front();
        --in_flight_;
        any_ready = true;
      }
    }
    if (any_ready && opt_.ready) opt_.ready();
    if (opt_.counts) {
      if (s.ok()) {
        opt_.counts->batches.fetch_add(1);
        opt_.counts->rows.fetch_add(n);
      } else {
        opt_.counts->draw_errors.fetch_add(1);
      }
    }
  }
}

}  // namespace memoire
