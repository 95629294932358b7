// The server's end of its sampling streams: see core/stream_hub.h.
#include "core/stream_hub.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace memoire {

namespace {

// Keeps a sent message's bytes (a batch, or a failed draw's reason) until libzmq's I/O thread
// has sent them.
struct SentMessage {
  StreamRowsSampler::Outcome outcome;
  std::string kind;  // a failed draw's ERROR kind
  std::string header;
};

}  // namespace

Status ServerShm::Create(const StreamLayout& layout, int64_t slots,
                         std::shared_ptr<ServerShm>* out) {
  auto shm = std::make_shared<ServerShm>();
  shm->layout = layout;
  shm->slot_layout = StreamSlotLayout(shm->layout);
  shm->slots = slots;
  MEMOIRE_RETURN_IF_ERROR(ShmRegion::Create(
      StreamRing::Bytes(slots) + shm->slot_layout.slot_bytes * slots, &shm->region));
  StreamRing::Init(shm->ring(), slots);
  *out = std::move(shm);
  return Status::OK();
}

StreamLayout MemoryStreamLayout(const ReplayMemory& rm, int64_t n) {
  const ReplayMemory::Options o = rm.options();
  StreamLayout l;
  l.schema = rm.schema();
  l.batch_size = n;
  l.frame_stack = o.frame_stack;
  l.multi_step = o.multi_step;
  for (size_t i = 0; i < l.flags.size(); ++i) l.flags[i] = o.cache_flags[i];
  return l;
}

Status StreamHub::Make(void* socket, std::shared_ptr<StreamHub>* out) {
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0)
    return Error(Code::kResourceExhausted, "stream: eventfd: ", std::strerror(errno));
  out->reset(new StreamHub(socket, wake_fd));
  return Status::OK();
}

StreamHub::StreamHub(void* socket, int wake_fd)
    : socket_(socket), wake_fd_(wake_fd), counts_(std::make_shared<StreamCounts>()) {}

StreamHub::~StreamHub() {
  Clear();
  close(wake_fd_);
}

Status StreamHub::Add(const std::string& identity, std::shared_ptr<ReplayMemory> rm,
                      std::shared_ptr<ServerShm> shm, int threads, int64_t ahead,
                      std::shared_ptr<RateLimiter> limiter, int error_pause_ms,
                      int limited_pause_ms) {
  Remove(identity);
  StreamSampler::Options o;
  o.memory = std::move(rm);
  o.limiter = std::move(limiter);
  o.layout = shm->slot_layout;
  o.frame_stack = shm->layout.frame_stack;
  o.control = shm->ring();
  o.base = shm->slot_base();
  o.keep = shm;
  o.slots = shm->slots;
  o.ahead = ahead;
  o.threads = threads;
  o.error_pause_ms = error_pause_ms;
  o.limited_pause_ms = limited_pause_ms;
  o.counts = counts_;
  o.wake = [this] { Wake(&refused_); };  // a refused credit: Poll returns, Python drops it
  std::unique_ptr<StreamSampler> sampler;
  MEMOIRE_RETURN_IF_ERROR(StreamSampler::Make(std::move(o), &sampler));
  std::lock_guard<std::mutex> l(mu_);
  samplers_[identity] = std::move(sampler);
  return Status::OK();
}

Status StreamHub::AddRows(const std::string& identity, StreamRowsSampler::Options o,
                          int send_timeout_ms) {
  Remove(identity);
  o.counts = counts_;
  o.ready = [this] { Wake(&sends_due_); };
  Schema schema = o.memory ? o.memory->schema() : Schema();
  std::unique_ptr<StreamRowsSampler> sampler;
  MEMOIRE_RETURN_IF_ERROR(StreamRowsSampler::Make(std::move(o), &sampler));
  std::lock_guard<std::mutex> l(mu_);
  rows_[identity] = std::make_shared<const RowsStream>(
      RowsStream{std::move(sampler), std::move(schema), send_timeout_ms});
  return Status::OK();
}

bool StreamHub::Remove(const std::string& identity) {
  std::shared_ptr<StreamSampler> s;
  std::shared_ptr<StreamRowsSampler> r;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = samplers_.find(identity); it != samplers_.end()) {
      s = std::move(it->second);
      samplers_.erase(it);
    }
    if (auto it = rows_.find(identity); it != rows_.end()) {
      r = it->second->sampler;
      rows_.erase(it);
    }
  }
  if (s) s->Stop();
  if (r) r->Stop();
  return s || r;
}

void StreamHub::Clear() {
  std::map<std::string, std::shared_ptr<StreamSampler>> all;
  std::map<std::string, std::shared_ptr<const RowsStream>> rows;
  {
    std::lock_guard<std::mutex> l(mu_);
    all.swap(samplers_);
    rows.swap(rows_);
  }
  for (auto& kv : all) kv.second->Stop();
  for (auto& kv : rows) kv.second->sampler->Stop();
}

std::shared_ptr<StreamSampler> StreamHub::Find(const std::string& identity) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = samplers_.find(identity);
  return it == samplers_.end() ? nullptr : it->second;
}

std::shared_ptr<StreamRowsSampler> StreamHub::FindRows(const std::string& identity) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = rows_.find(identity);
  return it == rows_.end() ? nullptr : it->second->sampler;
}

Status StreamHub::Poll(int timeout_ms, std::unique_ptr<libzmq::Frames>* out) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    if (sends_due_.exchange(false)) SendReady();
    if (refused_.exchange(false)) return Status::OK();
    auto frames = std::make_unique<libzmq::Frames>();
    int rc = libzmq::Receive(socket_, 0, frames.get());
    if (rc < 0)
      return Error(Code::kFailedPrecondition, "stream: socket error: ", libzmq::LastError());
    if (rc == 1) {
      *out = std::move(frames);
      return Status::OK();
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - Clock::now()).count();
    if (left <= 0) return Status::OK();
    rc = libzmq::WaitReadable(socket_, wake_fd_, static_cast<int>(left));
    if (rc < 0)
      return Error(Code::kFailedPrecondition, "stream: socket error: ", libzmq::LastError());
    if (rc & 2) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof(v));
    }
  }
}

std::vector<std::pair<std::string, std::string>> StreamHub::Refusals() {
  std::vector<std::pair<std::string, std::string>> out;
  std::lock_guard<std::mutex> l(mu_);
  for (auto& kv : samplers_) {
    std::string why = kv.second->refusal();
    if (!why.empty()) out.emplace_back(kv.first, std::move(why));
  }
  return out;
}

void StreamHub::Wake(std::atomic<bool>* flag) {
  flag->store(true);
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void StreamHub::SendReady() {
  std::vector<std::pair<std::string, std::shared_ptr<const RowsStream>>> rows;
  {
    std::lock_guard<std::mutex> l(mu_);
    rows.assign(rows_.begin(), rows_.end());
  }
  std::vector<StreamRowsSampler::Outcome> ready;
  std::vector<codec::Frame> data;
  for (auto& [identity, stream] : rows) {
    ready.clear();
    stream->sampler->TakeReady(&ready);
    for (StreamRowsSampler::Outcome& o : ready) {
      auto m = std::make_shared<SentMessage>();
      m->outcome = std::move(o);
      Status s;
      if (m->outcome.batch) {
        s = EncodeStreamBatch(*m->outcome.batch, stream->schema, &m->header, &data);
      } else {
        m->kind = kDrawError;
        s = EncodeErrorMessage(m->kind, m->outcome.error, &m->header, &data);
      }
      std::vector<libzmq::OutFrame> frames{{identity.data(), identity.size()},
                                           {m->header.data(), m->header.size()}};
      for (const codec::Frame& f : data) frames.push_back({f.data, f.size});
      if (!s.ok() || !libzmq::Send(socket_, frames, stream->send_timeout_ms,
                                   std::shared_ptr<const void>(m, m.get())))
        counts_->send_errors.fetch_add(1);
    }
  }
}

}  // namespace memoire
