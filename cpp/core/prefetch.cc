#include "core/prefetch.h"

#include <cstdlib>
#include <exception>
#include <utility>

#include "core/batch_scheduling.h"
#include "core/slot_wait.h"
#include "core/thread_name.h"

namespace memoire {

namespace {
constexpr size_t kAlign = 64;
size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
// Blocks are whole pages: a device ring page-locks each one (cudaHostRegister refuses a page
// already registered, which two blocks sharing a page would be).
constexpr size_t kPage = 4096;
}  // namespace

Status Prefetcher::Make(const Options& o, Fill fill, std::unique_ptr<Prefetcher>* out) {
  if (o.depth < 1)
    return Error(Code::kInvalidArgument, "depth: expected >= 1, got ", o.depth);
  if (o.threads < 1 || o.threads > o.depth)
    return Error(Code::kInvalidArgument, "threads: expected 1 <= threads <= depth (", o.depth,
                 "), got ", o.threads);
  if (!fill) return Error(Code::kInvalidArgument, "fill: expected a callback");
  size_t bytes = 0;
  for (size_t b : o.part_bytes) bytes += RoundUp(b);
  if (bytes == 0) bytes = kAlign;
  bytes = (bytes + kPage - 1) / kPage * kPage;
  std::unique_ptr<Prefetcher> p(new Prefetcher(o, std::move(fill)));
  p->block_bytes_ = bytes;
  for (int s = 0; s < o.depth; ++s) {
    void* block = std::aligned_alloc(kPage, bytes);
    if (block == nullptr)
      return Error(Code::kResourceExhausted, "prefetch ring: cannot allocate ", o.depth, " x ",
                   bytes, " bytes");
    p->blocks_.emplace_back(static_cast<uint8_t*>(block), std::free);
    std::vector<uint8_t*> parts;
    size_t off = 0;
    for (size_t b : o.part_bytes) {
      parts.push_back(p->blocks_.back().get() + off);
      off += RoundUp(b);
    }
    p->slot_parts_.push_back(std::move(parts));
    p->free_.push_back(s);
  }
  for (int t = 0; t < o.threads; ++t) {
    p->threads_.emplace_back(&Prefetcher::Run, p.get(), t);
    NameThread(p->threads_.back(), "memoire-feed");
  }
  *out = std::move(p);
  return Status::OK();
}

Prefetcher::Prefetcher(const Options& o, Fill fill)
    : opt_(o),
      fill_(std::move(fill)),
      state_(o.depth, State::kFree),
      status_(o.depth) {}

Prefetcher::~Prefetcher() { Close(); }

void Prefetcher::Run(int thread) {
  SetBatchScheduling(true);
  for (;;) {
    int slot;
    {
      std::unique_lock<std::mutex> lock(mu_);
      free_cv_.wait(lock, [&] { return closing_ || !free_.empty(); });
      if (closing_) return;
      slot = free_.front();
      free_.pop_front();
      state_[slot] = State::kFilling;
    }
    Status s;
    try {
      s = fill_(thread, slot_parts_[slot].data());
    } catch (const std::exception& e) {  // e.g. bad_alloc: never let it end the process
      s = Error(Code::kInternal, "prefetch fill failed: ", e.what());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_[slot] = std::move(s);
      state_[slot] = State::kReady;
      ready_.push_back(slot);
      ++filled_;
    }
    ready_cv_.notify_one();
  }
}

Status Prefetcher::Take(int* slot) {
  std::unique_lock<std::mutex> lock(mu_);
  WaitForSlot(lock, ready_cv_, held_, opt_.depth, opt_.held_wait_ms,
              [this] { return closing_ || !ready_.empty(); });
  if (closing_) return Error(Code::kFailedPrecondition, "the feed is closed");
  if (ready_.empty())
    return Error(Code::kFailedPrecondition, "every one of the feed's ", opt_.depth,
                 " slots is held by a batch still in use: drop a batch (or raise depth)")
        .With("held", opt_.depth);
  const int s = ready_.front();
  ready_.pop_front();
  state_[s] = State::kTaken;
  ++held_;
  ++taken_;
  *slot = s;
  return status_[s];
}

void Prefetcher::Release(int slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot < 0 || slot >= opt_.depth || state_[slot] != State::kTaken) return;
    state_[slot] = State::kFree;
    status_[slot] = Status::OK();
    --held_;
    free_.push_back(slot);
  }
  free_cv_.notify_one();
  ready_cv_.notify_all();  // a Take waiting on a fully held ring re-checks
}

void Prefetcher::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  free_cv_.notify_all();
  ready_cv_.notify_all();
  std::lock_guard<std::mutex> join(join_mu_);
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
}

bool Prefetcher::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closing_;
}

int64_t Prefetcher::taken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return taken_;
}

int64_t Prefetcher::filled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return filled_;
}

}  // namespace memoire
