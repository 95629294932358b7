#include "core/stream_rows_sampler.h"

#include "core/batch_scheduling.h"
#include "core/thread_name.h"

namespace memoire {

Status StreamRowsSampler::Make(Options o, std::unique_ptr<StreamRowsSampler>* out) {
  if (!o.memory) return Error(Code::kInvalidArgument, "stream rows sampler: no memory");
  if (o.batch_size < 1 || o.credit < 0 || o.threads < 1 || o.threads > 256)
    return Error(Code::kInvalidArgument, "stream rows sampler: expected batch_size >= 1, "
                 "credit >= 0 and threads in [1, 256], got ", o.batch_size, ", ", o.credit,
                 " and ", o.threads);
  std::unique_ptr<StreamRowsSampler> s(new StreamRowsSampler(std::move(o)));
  for (int t = 0; t < s->opt_.threads; ++t) {
    s->threads_.emplace_back([p = s.get()] { p->Run(); });
    NameThread(s->threads_.back(), "memoire-rows");
  }
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
        WaitingForLearner waiting(opt_.counts.get());
        cv_.wait(l);
      }
      --credit_;
      ++in_flight_;
    }
    Status s;
    if (!LimiterLets(opt_.limiter.get(), n, opt_.counts.get(), &s)) {
      // Held back: the credit goes back; the stream waits a little.
      {
        std::lock_guard<std::mutex> l(mu_);
        ++credit_;
        --in_flight_;
        PauseAtLeast(&paused_until_, opt_.limited_pause_ms);
      }
      cv_.notify_all();
      continue;
    }
    auto batch = std::make_shared<StreamBatch>();
    DrawOrder<Outcome>::Entry* placed = nullptr;
    if (s.ok()) {  // else the limiter refused a batch its band can never allow
      batch->window = opt_.window;
      batch->send = opt_.send;
      batch->compressed_state = opt_.compressed_state;
      s = opt_.memory->SampleDistinct(n, batch.get(), [&] {
        std::lock_guard<std::mutex> l(mu_);
        placed = pending_.Place();
      });
    }
    // Counted before the batch is ready to send, as StreamSampler counts before its notice.
    CountDraw(opt_.counts.get(), s.ok(), n);
    bool any_ready = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (placed == nullptr) placed = pending_.Place();  // no draw (failed, refused): now
      if (s.ok()) {
        placed->value.batch = std::move(batch);
      } else {
        placed->value.error = s.message().empty() ? "the draw failed" : s.message();
        // Nothing to sample yet, most likely: the stream's threads wait a while.
        PauseAtLeast(&paused_until_, opt_.error_pause_ms);
      }
      placed->finished = true;
      // Numbered as they leave in draw order, so seq counts successful draws without gaps.
      any_ready = pending_.TakeFinished([&](Outcome& o) {
                    if (o.batch) o.batch->seq = next_seq_++;
                    ready_.push_back(std::move(o));
                    --in_flight_;
                  }) > 0;
    }
    if (any_ready && opt_.ready) opt_.ready();
  }
}

}  // namespace memoire
