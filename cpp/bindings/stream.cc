// The sampling stream's native ends: see bindings/stream.h and core/stream_batch.h.
#include "bindings/stream.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bindings/batch_views.h"
#include "bindings/common.h"
#include "bindings/device_feed.h"
#include "bindings/libzmq.h"
#include "core/rate_limiter.h"
#include "core/replay_memory.h"
#include "core/stream_rows_sampler.h"
#include "core/stream_sampler.h"

namespace memoire {

namespace {

constexpr int kSliceMs = 5;  // a waiting receive checks for posts and Stop this often
// The ERROR kind of a failed draw (memoire/server/sampling_service.py DRAW_ERROR): unlike a
// refusal, it spent a credit.
constexpr const char* kDrawError = "SampleError";

std::vector<codec::Frame> ViewsOf(const libzmq::Frames& frames) {
  std::vector<codec::Frame> views(frames.size());
  for (size_t i = 0; i < views.size(); ++i) views[i] = {frames.data(i), frames.bytes(i)};
  return views;
}

// What the learner's next batch raises when the server refused a request / its draw failed.
Status Refused(const std::string& kind, const std::string& reason) {
  return Error(Code::kFailedPrecondition, "stream: the server refused: ", kind, ": ", reason)
      .With("server_error", 1);
}
Status DrawFailed(const std::string& reason) {
  return Error(Code::kFailedPrecondition, "stream: the server's draw failed: ", reason)
      .With("server_error", 1);
}

void SendStrings(void* socket, const std::vector<std::string>& frames, int timeout_ms) {
  std::vector<libzmq::OutFrame> out;
  for (const std::string& f : frames) out.push_back({f.data(), f.size()});
  libzmq::Send(socket, out, timeout_ms, nullptr);  // a full queue drops it: the timeout tells
}

}  // namespace

void ShmRegion::RemoveOrphans(int min_age_s) {
  DIR* dir = opendir(kDir);
  if (dir == nullptr) return;
  const size_t prefix = std::strlen(kPrefix);
  const time_t now = time(nullptr);
  while (const dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, kPrefix, prefix) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(e->d_name + prefix, &end, 10);
    if (end == e->d_name + prefix || *end != '-' || pid <= 0) continue;
    const std::string path = std::string(kDir) + e->d_name;
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        now - st.st_mtime < min_age_s)
      continue;
    // Its creator is gone (never a live process of this pid namespace): nobody maps it now.
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) unlink(path.c_str());
  }
  closedir(dir);
}

Status ShmRegion::Create(size_t bytes, std::unique_ptr<ShmRegion>* out) {
  RemoveOrphans(kOrphanAgeS);
  std::random_device rd;
  char name[64];
  std::snprintf(name, sizeof(name), "%s%d-%08x%08x", kPrefix, static_cast<int>(getpid()), rd(),
                rd());
  std::unique_ptr<ShmRegion> r(new ShmRegion());
  r->path_ = std::string(kDir) + name;
  const int fd = open(r->path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Error(Code::kFailedPrecondition, "shared memory: cannot create ", r->path_,
                           ": ", std::strerror(errno));
  r->owner_ = true;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    close(fd);
    return Error(Code::kResourceExhausted, "shared memory: cannot size ", r->path_, " to ", bytes,
                 " bytes: ", std::strerror(e));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Error(Code::kResourceExhausted, "shared memory: cannot map ", bytes,
                                    " bytes: ", std::strerror(errno));
  r->data_ = static_cast<uint8_t*>(p);
  r->bytes_ = bytes;
  *out = std::move(r);
  return Status::OK();
}

Status ShmRegion::Open(const std::string& path, size_t bytes, std::unique_ptr<ShmRegion>* out) {
  const std::string want = std::string(kDir) + kPrefix;
  if (path.compare(0, want.size(), want) != 0 || path.find('/', want.size()) != std::string::npos ||
      path.find("..") != std::string::npos)
    return Error(Code::kDataLoss, "shared memory: expected a path ", want, "..., got ", path);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Error(Code::kFailedPrecondition, "shared memory: cannot open ", path, ": ",
                           std::strerror(errno), " (is the server on another host? use "
                           "shared_memory=False)");
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) < bytes) {
    close(fd);
    return Error(Code::kDataLoss, "shared memory: ", path, " is not a file of ", bytes, " bytes");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Error(Code::kFailedPrecondition, "shared memory: cannot map ", path,
                                    ": ", std::strerror(errno));
  unlink(path.c_str());  // mapped on both sides now: nothing is left behind by a crash
  std::unique_ptr<ShmRegion> r(new ShmRegion());
  r->path_ = path;
  r->data_ = static_cast<uint8_t*>(p);
  r->bytes_ = bytes;
  *out = std::move(r);
  return Status::OK();
}

ShmRegion::~ShmRegion() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (owner_) unlink(path_.c_str());  // a learner that never mapped it: ENOENT otherwise
}

void StreamSource::FlushLocked() {
  std::deque<std::vector<std::string>> q;
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    q.swap(queue_);
    queued_.store(false);
  }
  for (const auto& frames : q) SendStrings(opt_.socket, frames, opt_.timeout_ms);
  if (owed_ >= opt_.credit_chunk) {
    SendStrings(opt_.socket, opt_.credit_message, opt_.timeout_ms);
    owed_ -= opt_.credit_chunk;
    credit_returned_.fetch_add(opt_.credit_chunk);
  }
}

void StreamSource::Post(std::vector<std::string> frames) {
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    queue_.push_back(std::move(frames));
    queued_.store(true);
  }
  // Sent now, or by the thread holding the socket (the receiving thread) as it lets go.
  SendQueued();
}

void StreamSource::SendQueued() {
  // A Post that found the socket taken left its message to the holder: each holder comes
  // here once it has let go, so a message never waits for a receive that may not come (the
  // receiving thread parked on a full ring, the consumer waiting for the message's effect).
  // The fence orders a Post's flag before its try_lock, and a holder's unlock before its
  // look at the flag: one of the two always sees the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  while (queued_.load()) {
    std::unique_lock<std::mutex> io(io_mu_, std::try_to_lock);
    if (!io.owns_lock()) return;  // its holder sends it, and looks again as it lets go
    FlushLocked();
  }
}

Status StreamSource::SocketTurn(Clock::time_point* next_ping, int wait_ms,
                                libzmq::Frames* frames, bool* got) {
  int rc;
  {
    std::lock_guard<std::mutex> io(io_mu_);
    FlushLocked();
    const auto now = Clock::now();
    if (now >= *next_ping) {
      // A restarted server does not know this stream: the ping makes it say so.
      SendStrings(opt_.socket, opt_.ping_message, kSliceMs);
      *next_ping = now + std::chrono::milliseconds(opt_.ping_ms);
    }
    rc = libzmq::Receive(opt_.socket, wait_ms, frames);
  }
  SendQueued();
  if (rc < 0)
    return Error(Code::kFailedPrecondition, "stream: socket error: ", libzmq::LastError());
  *got = rc == 1;
  return Status::OK();
}

Status StreamSource::TimedOut() const {
  return Error(Code::kFailedPrecondition, "stream: no batch from the server within ",
               opt_.timeout_ms, " ms (is it running? a dead or unreachable server is "
               "noticed this way)")
      .With("timeout", opt_.timeout_ms);
}

Status StreamSource::Receive(libzmq::Frames* frames) {
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(opt_.timeout_ms);
  auto next_ping = start + std::chrono::milliseconds(opt_.ping_ms);
  bool waited = false;
  while (true) {
    if (stopping_.load()) return Error(Code::kFailedPrecondition, "the stream is closed");
    bool got = false;
    MEMOIRE_RETURN_IF_ERROR(SocketTurn(&next_ping, waited ? kSliceMs : 0, frames, &got));
    if (got) return Status::OK();
    waited = true;
    if (Clock::now() >= deadline) return TimedOut();
  }
}

Status StreamSource::Fill(int thread, uint8_t* const* parts) {
  if (thread != 0) return Error(Code::kInternal, "stream: one receiving thread per stream");
  libzmq::Frames frames;
  MEMOIRE_RETURN_IF_ERROR(Receive(&frames));
  const std::vector<codec::Frame> views = ViewsOf(frames);
  std::string kind, reason;
  const bool error = ReadErrorMessage(views.data(), views.size(), &kind, &reason);
  Status s;
  if (error && kind == kDrawError) {
    s = DrawFailed(reason);
  } else if (error) {
    s = Refused(kind, reason);
  } else {
    int64_t seq = -1;
    s = UnstackStreamBatch(views.data(), views.size(), opt_.layout, opt_.limits, parts, &seq,
                           &scratch_);
    if (s.ok() && seq != last_seq_.load() + 1)  // one connection keeps order: none was lost
      s = Error(Code::kDataLoss, "stream: batch ", seq, " came after batch ", last_seq_.load());
    if (seq >= 0) last_seq_.store(seq);  // one error per gap, not one per later batch
    if (s.ok()) received_.fetch_add(1);
  }
  if (!error || kind == kDrawError) {
    // The server spent a credit on this message (a batch or a failed draw): give it back, now
    // that its rows are read.
    {
      std::lock_guard<std::mutex> io(io_mu_);
      ++owed_;
      FlushLocked();
    }
    SendQueued();
  }
  return s;
}

Status StreamSource::Next(int64_t* slot) {
  std::lock_guard<std::mutex> take(take_mu_);
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    if (num_held_ >= opt_.slots)
      return Error(Code::kFailedPrecondition, "stream: the learner holds all ", opt_.slots,
                   " batches the stream's credit allows (drop some, or open it with more "
                   "credit)")
          .With("held", num_held_);
  }
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(opt_.timeout_ms);
  auto next_ping = start + std::chrono::milliseconds(opt_.ping_ms);
  // The socket carries no batch, only the server's refusals: it is read when no notice waits,
  // and every ping_ms while notices keep coming (so a refusal is never held back for long).
  bool read_socket = start >= next_socket_read_;
  StreamRing::Notice n;
  while (true) {
    if (stopping_.load()) return Error(Code::kFailedPrecondition, "the stream is closed");
    if (!read_socket && ring_.PollNotice(&n)) return TakeNotice(n, slot);
    read_socket = false;
    const auto now = Clock::now();
    next_socket_read_ = now + std::chrono::milliseconds(opt_.ping_ms);
    libzmq::Frames frames;
    bool got = false;
    MEMOIRE_RETURN_IF_ERROR(SocketTurn(&next_ping, 0, &frames, &got));
    if (got) {
      const std::vector<codec::Frame> views = ViewsOf(frames);
      std::string kind, reason;
      if (ReadErrorMessage(views.data(), views.size(), &kind, &reason))
        return Refused(kind, reason);
      return Error(Code::kDataLoss, "stream: expected only errors on a shared-memory stream's "
                   "socket (batches come through its ring), got another message");
    }
    if (ring_.PollNotice(&n)) return TakeNotice(n, slot);
    if (now >= deadline) return TimedOut();
    ring_.WaitNotices(kSliceMs);
  }
}

Status StreamSource::TakeNotice(const StreamRing::Notice& n, int64_t* slot) {
  std::lock_guard<std::mutex> l(queue_mu_);
  // The server may only name a slot it was given: never one the learner reads.
  if (n.slot < 0 || n.slot >= opt_.slots || held_[n.slot])
    return Error(Code::kDataLoss, "stream: ", n.error_bytes > 0 ? "a failed draw" : "a batch",
                 " in slot ", n.slot, ", which is not the server's to write (", opt_.slots,
                 " slots)");
  if (n.error_bytes != 0) {
    if (n.error_bytes < 0 || n.error_bytes > static_cast<int64_t>(StreamRing::kMaxErrorBytes))
      return Error(Code::kDataLoss, "stream: a failed draw's reason of ", n.error_bytes,
                   " bytes (expected 1..", StreamRing::kMaxErrorBytes, ")");
    const std::string reason(reinterpret_cast<const char*>(slot_data(n.slot)),
                             static_cast<size_t>(n.error_bytes));
    // A failed draw spent the slot it would have filled: it goes straight back.
    ring_.PublishCredit(n.slot);
    return DrawFailed(reason);
  }
  const int64_t last = last_seq_.load();
  last_seq_.store(n.seq);  // one error per gap, not one per later batch
  if (n.seq != last + 1)  // the ring keeps order: none was lost
    return Error(Code::kDataLoss, "stream: batch ", n.seq, " came after batch ", last);
  *slot = n.slot;
  held_[n.slot] = 1;
  ++num_held_;
  received_.fetch_add(1);
  return Status::OK();
}

void StreamSource::Release(int64_t slot) {
  std::lock_guard<std::mutex> l(queue_mu_);
  if (slot < 0 || slot >= opt_.slots || !held_[slot]) return;
  held_[slot] = 0;
  --num_held_;
  // At once: the server writes the slot given back last first, so a learner that takes
  // batches as they come keeps a few slots in rotation, whose lines are still in cache.
  ring_.PublishCredit(slot);
  credit_returned_.fetch_add(1);
}

namespace {

// Keeps a sent message's bytes (a batch, or a failed draw's reason) until libzmq's I/O thread
// has sent them.
struct SentMessage {
  StreamRowsSampler::Outcome outcome;
  std::string kind;  // a failed draw's ERROR kind
  std::string header;
};

// A stream's shared memory on the server's side: the mapping (its ring, then its slots) and
// the layout its batches are written in (fixed at open).
struct ServerShm {
  std::unique_ptr<ShmRegion> region;
  StreamLayout layout;
  BatchLayout slot_layout;
  int64_t slots = 0;
  uint8_t* ring() const { return region->data(); }
  uint8_t* slot_base() const { return region->data() + StreamRing::Bytes(slots); }
};

// The native side of one stream worker's ROUTER socket. It keeps each stream's sampler
// threads: a shared-memory stream's (core/stream_sampler.h, which trade notices and slots with
// their learner through the stream's ring, no socket involved) and a rows stream's
// (core/stream_rows_sampler.h, whose batches this hub sends as they come out, in order). It
// waits on the socket with the GIL released (Poll), sending the rows streams' batches
// meanwhile; every message received goes to Python, and so does a shared-memory sampler's
// refused credit (refusals). Only the worker's thread uses the socket: Poll, and Python between
// polls.
class StreamHub {
 public:
  explicit StreamHub(void* socket)
      : socket_(socket),
        wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        counts_(std::make_shared<StreamCounts>()) {
    if (wake_fd_ < 0)
      ThrowIfError(Error(Code::kResourceExhausted, "stream: eventfd: ", std::strerror(errno)));
  }
  ~StreamHub() {
    Clear();
    close(wake_fd_);
  }

  // Starts the sampler of `identity`'s shared-memory stream (its slots in `shm`), replacing
  // any stream of that peer.
  void Add(const std::string& identity, std::shared_ptr<ReplayMemory> rm,
           std::shared_ptr<ServerShm> shm, int threads, int64_t ahead,
           std::shared_ptr<RateLimiter> limiter, int error_pause_ms, int limited_pause_ms) {
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
    ThrowIfError(StreamSampler::Make(std::move(o), &sampler));
    std::lock_guard<std::mutex> l(mu_);
    samplers_[identity] = std::move(sampler);
  }

  // Starts the sampler of `identity`'s rows stream (its batches sent to it on this socket by
  // Poll, each within send_timeout_ms), replacing any stream of that peer.
  void AddRows(const std::string& identity, StreamRowsSampler::Options o, int send_timeout_ms) {
    Remove(identity);
    o.counts = counts_;
    o.ready = [this] { Wake(&sends_due_); };
    Schema schema = o.memory ? o.memory->schema() : Schema();
    std::unique_ptr<StreamRowsSampler> sampler;
    ThrowIfError(StreamRowsSampler::Make(std::move(o), &sampler));
    std::lock_guard<std::mutex> l(mu_);
    rows_[identity] = std::make_shared<const RowsStream>(
        RowsStream{std::move(sampler), std::move(schema), send_timeout_ms});
  }

  // Stops `identity`'s sampler (joins its threads) and forgets it, with any batch not yet sent;
  // false when there is none.
  bool Remove(const std::string& identity) {
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

  void Clear() {
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

  std::shared_ptr<StreamSampler> Find(const std::string& identity) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = samplers_.find(identity);
    return it == samplers_.end() ? nullptr : it->second;
  }
  std::shared_ptr<StreamRowsSampler> FindRows(const std::string& identity) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = rows_.find(identity);
    return it == rows_.end() ? nullptr : it->second->sampler;
  }

  // Waits up to timeout_ms for a message (*out set to it, for Python) or a sampler's refused
  // credit (returns with *out empty: see Refusals), sending the rows streams' batches as they
  // come. kFailedPrecondition on a socket error.
  Status Poll(int timeout_ms, std::unique_ptr<libzmq::Frames>* out) {
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

  // (identity, why) of each sampler that refused its learner's credit and draws no more.
  std::vector<std::pair<std::string, std::string>> Refusals() {
    std::vector<std::pair<std::string, std::string>> out;
    std::lock_guard<std::mutex> l(mu_);
    for (auto& kv : samplers_) {
      std::string why = kv.second->refusal();
      if (!why.empty()) out.emplace_back(kv.first, std::move(why));
    }
    return out;
  }

  StreamCounts& counts() { return *counts_; }

 private:
  struct RowsStream {
    std::shared_ptr<StreamRowsSampler> sampler;
    Schema schema;  // the memory's, for the batches' headers
    int send_timeout_ms = 1000;
  };

  // Sets *flag and wakes Poll (a full eventfd counter still wakes it).
  void Wake(std::atomic<bool>* flag) {
    flag->store(true);
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  // Sends each rows stream's finished outcomes, in order: a batch, or a failed draw as an
  // ERROR of kind SampleError (its credit spent, as a batch's). A message that cannot be
  // queued in time (a peer gone) is dropped and counted: the learner notices by its timeout.
  void SendReady() {
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

  void* const socket_;
  const int wake_fd_;
  std::shared_ptr<StreamCounts> counts_;
  std::atomic<bool> sends_due_{false};  // a rows sampler has outcomes ready
  std::atomic<bool> refused_{false};    // a shared-memory sampler refused a credit
  std::mutex mu_;  // guards samplers_ and rows_
  std::map<std::string, std::shared_ptr<StreamSampler>> samplers_;
  std::map<std::string, std::shared_ptr<const RowsStream>> rows_;
};

// The layout of a stream of batches of n from `rm` as it is set now.
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

StreamLayout LayoutFrom(const py::list& templates, int64_t batch_size, int frame_stack,
                        int multi_step, const std::vector<bool>& flags) {
  StreamLayout l;
  CheckLength(static_cast<int64_t>(templates.size()), protocol::kNumFields, "templates", "field");
  CheckLength(static_cast<int64_t>(flags.size()), 2 * protocol::kNumFields, "flags", "stack");
  std::vector<Field> fields;
  for (int f = 0; f < protocol::kNumFields; ++f)
    fields.push_back(FieldFromTemplate(protocol::kFieldNames[f], templates[f]));
  ThrowIfError(Schema::Make(fields, &l.schema));
  l.batch_size = batch_size;
  l.frame_stack = frame_stack;
  l.multi_step = multi_step;
  for (size_t i = 0; i < flags.size(); ++i) l.flags[i] = flags[i];
  ThrowIfError(l.Check());
  return l;
}

std::vector<std::string> Strings(const py::list& frames) {
  std::vector<std::string> out;
  for (const py::handle& h : frames) {
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(h).request();
    out.emplace_back(static_cast<const char*>(info.ptr),
                     static_cast<size_t>(info.size * info.itemsize));
  }
  return out;
}

// A shared-memory stream's slots as the host ring of a device feed: the copy thread takes each
// batch's notice, copies the slot the server wrote, and gives it back at once.
class StreamSlots : public HostBatches {
 public:
  explicit StreamSlots(std::shared_ptr<StreamSource> source) : source_(std::move(source)) {
    const BatchLayout& l = source_->slot_layout();
    for (const BatchPart& p : l.parts) part_bytes_.push_back(p.none ? 0 : p.bytes);
    parts_.resize(static_cast<size_t>(source_->slots()));
    for (int64_t s = 0; s < source_->slots(); ++s) {
      parts_[s].resize(l.parts.size());
      l.PartsAt(source_->slot_data(s), parts_[s].data());
    }
  }
  Status Take(int* slot) override {
    *slot = -1;
    int64_t s = -1;
    Status status = source_->Next(&s);
    if (status.ok()) *slot = static_cast<int>(s);
    return status;
  }
  bool closed() const override { return source_->stopped(); }
  void Release(int slot) override { source_->Release(slot); }
  uint8_t* const* parts(int slot) const override { return parts_[slot].data(); }
  const std::vector<size_t>& part_bytes() const override { return part_bytes_; }
  int slots() const override { return static_cast<int>(source_->slots()); }
  uint8_t* block(int slot) const override { return source_->slot_data(slot); }
  size_t block_bytes() const override { return source_->slot_layout().slot_bytes; }
  void Close() override { source_->Stop(); }

 private:
  std::shared_ptr<StreamSource> source_;
  std::vector<size_t> part_bytes_;
  std::vector<std::vector<uint8_t*>> parts_;  // per slot, per part (null for none parts)
};

// A shared-memory batch handed out: its slot, held until the last view is dropped.
struct SlotLease {
  std::shared_ptr<StreamSource> source;
  int64_t slot;
};

}  // namespace

FeedRing StreamSlotsOf(const py::object& source) {
  auto src = source.cast<std::shared_ptr<StreamSource>>();
  if (!src->shared_memory())
    ThrowInvalid("source: the stream's rows travel in messages (a device feed copies from a "
                 "_core.Feed over it)");
  FeedRing out{std::make_shared<StreamSlots>(src), {}, {}, {}};
  for (const BatchPart& p : src->slot_layout().parts) {
    out.dtypes.push_back(ToNumpy(p.dtype));
    out.shapes.emplace_back(p.shape.begin(), p.shape.end());
    out.none.push_back(p.none);
  }
  return out;
}

void BindStream(py::module_& m) {
  py::class_<StreamSource, std::shared_ptr<StreamSource>>(m, "StreamSource", R"doc(
A learner's end of a sampling stream (private: use memoire.stream.SamplingStream). Rows in the
messages: a source for _core.Feed that receives each batch from a connected DEALER socket and
stacks it into the ring. Shared memory (shm_path given): `take` hands out views of the slot the
server wrote the batch into.

StreamSource(socket, templates, batch_size, frame_stack, multi_step, flags, timeout_ms,
ping_ms, credit_chunk, credit_message, ping_message, max_payload_bytes, shm_path, shm_slots,
shm_slot_bytes): `socket` is the
DEALER's `underlying` address (requires attach_libzmq; Python keeps the socket open and does not
use it while the source lives); templates, the 7 field templates; flags, the 14 cache flags;
credit_message / ping_message, encoded frames of a credit of credit_chunk / of 0; shm_path
(non-empty): the server's StreamShm (its ring, then shm_slots slots of shm_slot_bytes), mapped
read-write.
)doc")
      .def(py::init([](uintptr_t socket, const py::list& templates, int64_t batch_size,
                       int frame_stack, int multi_step, const std::vector<bool>& flags,
                       int timeout_ms, int ping_ms, int64_t credit_chunk,
                       const py::list& credit_message, const py::list& ping_message,
                       uint64_t max_payload_bytes, const std::string& shm_path,
                       int64_t shm_slots, uint64_t shm_slot_bytes, bool compressed_state) {
             if (!libzmq::Attached())
               ThrowIfError(Error(Code::kFailedPrecondition, "the sampling stream needs the "
                                  "native message path (pyzmq's libzmq, see memoire.transport."
                                  "native_libzmq)"));
             if (socket == 0) ThrowInvalid("socket: expected a socket address, got 0");
             if (timeout_ms < 1 || ping_ms < 1 || credit_chunk < 1)
               ThrowInvalid("timeout_ms, ping_ms and credit_chunk: expected >= 1");
             StreamSource::Options o;
             o.socket = reinterpret_cast<void*>(socket);
             o.layout = LayoutFrom(templates, batch_size, frame_stack, multi_step, flags);
             o.layout.compressed_state = compressed_state;
             o.limits.max_payload_bytes = max_payload_bytes;
             o.timeout_ms = timeout_ms;
             o.ping_ms = ping_ms;
             o.credit_chunk = credit_chunk;
             o.credit_message = Strings(credit_message);
             o.ping_message = Strings(ping_message);
             if (!shm_path.empty()) {
               // The server's slots must be exactly this layout's: every view stays inside.
               o.slot_layout = StreamSlotLayout(o.layout);
               if (shm_slots < 1 || shm_slots > (int64_t(1) << 20) ||
                   shm_slot_bytes != o.slot_layout.slot_bytes)
                 ThrowIfError(Error(Code::kDataLoss, "shared memory: expected slots of ",
                                    o.slot_layout.slot_bytes, " bytes, got ", shm_slots,
                                    " slots of ", shm_slot_bytes));
               std::unique_ptr<ShmRegion> r;
               o.slots_at = StreamRing::Bytes(shm_slots);
               ThrowIfError(
                   ShmRegion::Open(shm_path, o.slots_at + shm_slot_bytes * shm_slots, &r));
               ThrowIfError(StreamRing::Attach(r->data(), shm_slots, &o.ring));
               o.shm = std::move(r);
               o.slots = shm_slots;
             }
             return std::make_shared<StreamSource>(std::move(o));
           }),
           py::arg("socket"), py::arg("templates"), py::arg("batch_size"),
           py::arg("frame_stack"), py::arg("multi_step"), py::arg("flags"),
           py::arg("timeout_ms"), py::arg("ping_ms"), py::arg("credit_chunk"),
           py::arg("credit_message"), py::arg("ping_message"),
           py::arg("max_payload_bytes") = uint64_t(1) << 32, py::arg("shm_path") = "",
           py::arg("shm_slots") = 0, py::arg("shm_slot_bytes") = 0,
           py::arg("compressed_state") = false)
      .def("take", [](std::shared_ptr<StreamSource> src) {
             if (!src->shared_memory())
               ThrowInvalid("take: the stream's rows travel in messages (use a Feed)");
             int64_t slot = -1;
             Status s;
             {
               GilRelease release;
               s = src->Next(&slot);
             }
             ThrowIfError(s);
             // The slot goes back to the server once every view of the batch is dropped.
             py::capsule lease(new SlotLease{src, slot}, [](void* p) {
               auto* l = static_cast<SlotLease*>(p);
               l->source->Release(l->slot);
               delete l;
             });
             const BatchLayout& l = src->slot_layout();
             std::vector<uint8_t*> parts(l.parts.size());
             l.PartsAt(src->slot_data(slot), parts.data());
             return BatchViews(l, parts.data(), lease);
           }, R"doc(
Shared memory: the next batch, as views of its slot: prev[7], next[7] (None where the flags
leave a stack out), weight, prob, done, id, num_sampleable int64[1], total_weight f64[1].
The slot goes back to the server when every array is dropped. RuntimeError when the server
refused or its draw failed (attribute server_error), when nothing came within the timeout
(timeout), or when the learner holds every slot (held); ValueError on a malformed notice.
)doc")
      .def("post", [](StreamSource& s, const py::list& frames) {
             std::vector<std::string> f = Strings(frames);
             GilRelease release;
             s.Post(std::move(f));
           }, py::arg("frames"), "Sends an encoded message (its frames) to the server.")
      .def("stop", &StreamSource::Stop, "Ends a receive in progress (the feed then closes).")
      .def_property_readonly(
          "dtypes",
          [](const StreamSource& src) {
            py::list out;
            for (const BatchPart& p : src.slot_layout().parts)
              out.append(p.none ? py::object(py::none()) : py::object(ToNumpy(p.dtype)));
            return out;
          },
          "shared memory: each part's numpy dtype in a slot (None for a part left out); empty "
          "for rows in messages")
      .def_property_readonly("received", &StreamSource::received, "batches received")
      .def_property_readonly("credit_returned", &StreamSource::credit_returned,
                             "credit given back to the server after the first grant")
      .def_property_readonly("last_seq", &StreamSource::last_seq,
                             "the last batch's number (-1 before the first)");

  py::class_<ServerShm, std::shared_ptr<ServerShm>>(m, "StreamShm", R"doc(
A server's shared memory for one sampling stream (a new file in /dev/shm, mode 0600, removed
by the learner once mapped, or when this object goes). StreamShm(memory, batch_size, slots):
the stream's ring (core/stream_ring.h, ring_bytes), then room for `slots` batches of the
memory's layout now (frame_stack, cache_flags), each written as the learner reads it
(core/batch_layout.h; slot_bytes a whole number of pages).
)doc")
      .def(py::init([](const ReplayMemory& rm, int64_t batch_size, int64_t slots) {
             if (batch_size < 1 || slots < 1)
               ThrowInvalid("batch_size and slots: expected >= 1");
             auto shm = std::make_shared<ServerShm>();
             shm->layout = MemoryStreamLayout(rm, batch_size);
             shm->slot_layout = StreamSlotLayout(shm->layout);
             shm->slots = slots;
             ThrowIfError(ShmRegion::Create(
                 StreamRing::Bytes(slots) + shm->slot_layout.slot_bytes * slots, &shm->region));
             StreamRing::Init(shm->ring(), slots);
             return shm;
           }),
           py::arg("memory"), py::arg("batch_size"), py::arg("slots"))
      .def_static("slot_bytes_for", [](const ReplayMemory& rm, int64_t batch_size) {
             if (batch_size < 1) ThrowInvalid("batch_size: expected >= 1");
             return StreamSlotLayout(MemoryStreamLayout(rm, batch_size)).slot_bytes;
           }, py::arg("memory"), py::arg("batch_size"),
           "The bytes of one slot for batches of batch_size from memory as it is set now.")
      .def_property_readonly("path", [](const ServerShm& s) { return s.region->path(); })
      .def_property_readonly("bytes", [](const ServerShm& s) { return s.region->bytes(); })
      .def_property_readonly("slot_bytes",
                             [](const ServerShm& s) { return s.slot_layout.slot_bytes; })
      .def_property_readonly("slots", [](const ServerShm& s) { return s.slots; })
      .def_property_readonly("ring_bytes",
                             [](const ServerShm& s) { return StreamRing::Bytes(s.slots); },
                             "bytes of the ring before the slots");
  m.attr("STREAM_RING_VERSION") = StreamRing::kVersion;
  m.def("stream_ring_offsets", [](int64_t slots) {
          if (slots < 1) ThrowInvalid("slots: expected >= 1");
          const StreamRing::Offsets o = StreamRing::OffsetsOf(slots);
          return py::dict(py::arg("notice_head") = o.notice_head,
                          py::arg("notice_waiters") = o.notice_waiters,
                          py::arg("credit_head") = o.credit_head,
                          py::arg("notice_tail") = o.notice_tail,
                          py::arg("learner_events") = o.learner_events,
                          py::arg("server_waiters") = o.server_waiters,
                          py::arg("notices") = o.notices, py::arg("credits") = o.credits,
                          py::arg("bytes") = StreamRing::Bytes(slots));
        }, py::arg("slots"), R"doc(
Where a shared-memory stream's ring keeps its words (byte offsets in the mapping; for tests that
play a raw peer): notice_head, credit_head, notice_tail, learner_events, *_waiters (uint32),
notices (slots entries of int64
seq, slot, error_bytes, reserved), credits (slots int64 entries), bytes (the ring's size).
)doc");

  py::class_<StreamHub, std::shared_ptr<StreamHub>>(m, "StreamHub", R"doc(
The native side of a stream worker's ROUTER socket (private: memoire/server/sampling_service.py).
StreamHub(socket): `socket` is the ROUTER's `underlying` address (requires attach_libzmq); only
the worker's thread uses the socket, in `poll` and between polls. Shared-memory streams are
sampled by native threads (core/stream_sampler.h) that trade notices and slots with their
learner through the stream's ring: `add` starts one; `refusals` names those that refused a
credit and stopped.
)doc")
      .def(py::init([](uintptr_t socket) {
             if (!libzmq::Attached())
               ThrowIfError(Error(Code::kFailedPrecondition, "StreamHub: needs attach_libzmq"));
             if (socket == 0) ThrowInvalid("socket: expected a socket address, got 0");
             return std::make_shared<StreamHub>(reinterpret_cast<void*>(socket));
           }),
           py::arg("socket"))
      .def("add",
           [](StreamHub& h, const py::bytes& identity, std::shared_ptr<ReplayMemory> rm,
              std::shared_ptr<ServerShm> shm, int threads, int64_t ahead,
              std::shared_ptr<RateLimiter> limiter, int error_pause_ms, int limited_pause_ms) {
             if (!rm || !shm) ThrowInvalid("add: expected a ReplayMemory and a StreamShm");
             if (threads < 1 || threads > 256)
               ThrowInvalid("threads: expected 1..256, got " + std::to_string(threads));
             if (ahead < 0) ThrowInvalid("ahead: expected >= 0, got " + std::to_string(ahead));
             const std::string id = identity;
             GilRelease release;  // Add may stop a previous sampler (joins)
             h.Add(id, std::move(rm), std::move(shm), threads, ahead, std::move(limiter),
                   error_pause_ms, limited_pause_ms);
           },
           py::arg("identity"), py::arg("memory"), py::arg("shm"), py::arg("threads"),
           py::arg("ahead"), py::arg("limiter"), py::arg("error_pause_ms"),
           py::arg("limited_pause_ms"),
           "Starts `threads` sampler threads for the peer `identity`, writing into `shm`'s "
           "slots (all free now), keeping at most `ahead` batches drawn and not taken by the "
           "learner (0: up to the slots), obeying `limiter` (None: no limiter).")
      .def("add_rows",
           [](StreamHub& h, const py::bytes& identity, std::shared_ptr<ReplayMemory> rm,
              int64_t batch_size, int window, const std::vector<bool>& send,
              bool compressed_state, int64_t credit, int threads,
              std::shared_ptr<RateLimiter> limiter, int error_pause_ms, int limited_pause_ms,
              int send_timeout_ms) {
             if (!rm) ThrowInvalid("add_rows: expected a ReplayMemory");
             CheckLength(static_cast<int64_t>(send.size()), protocol::kNumFields, "send",
                         "field");
             StreamRowsSampler::Options o;
             o.memory = std::move(rm);
             o.limiter = std::move(limiter);
             o.batch_size = batch_size;
             o.window = window;
             for (int f = 0; f < protocol::kNumFields; ++f) o.send[f] = send[f];
             if (compressed_state && !o.memory->compress_states())
               ThrowInvalid("add_rows: compressed_state needs a memory that compresses states");
             o.compressed_state = compressed_state;
             o.credit = credit;
             o.threads = threads;
             o.error_pause_ms = error_pause_ms;
             o.limited_pause_ms = limited_pause_ms;
             const std::string id = identity;
             GilRelease release;  // AddRows may stop a previous sampler (joins)
             h.AddRows(id, std::move(o), send_timeout_ms);
           },
           py::arg("identity"), py::arg("memory"), py::arg("batch_size"), py::arg("window"),
           py::arg("send"), py::arg("compressed_state"), py::arg("credit"), py::arg("threads"),
           py::arg("limiter"),
           py::arg("error_pause_ms"), py::arg("limited_pause_ms"), py::arg("send_timeout_ms"),
           "Starts `threads` sampler threads for the peer `identity`'s rows stream: batches "
           "of `batch_size` distinct rows (the 7 fields `send` says, windows of `window`; "
           "states as the memory's LZ4 blocks with `compressed_state`), "
           "`credit` granted now, obeying `limiter` (None: no limiter); `poll` sends them.")
      .def("grant",
           [](StreamHub& h, const py::bytes& identity, int64_t k) {
             if (k < 0) ThrowInvalid("grant: expected k >= 0, got " + std::to_string(k));
             std::shared_ptr<StreamRowsSampler> s = h.FindRows(identity);
             if (!s) return false;
             s->Grant(k);
             return true;
           },
           py::arg("identity"), py::arg("k"),
           "`k` more batches for the peer's rows stream; False when it has none.")
      .def("outstanding",
           [](StreamHub& h, const py::bytes& identity) -> int64_t {
             std::shared_ptr<StreamRowsSampler> s = h.FindRows(identity);
             return s ? s->outstanding() : -1;
           },
           py::arg("identity"),
           "The peer's rows stream's credit not yet sent: undrawn, drawing or queued (-1: no "
           "rows stream).")
      .def("remove",
           [](StreamHub& h, const py::bytes& identity) {
             const std::string id = identity;
             GilRelease release;
             return h.Remove(id);
           },
           py::arg("identity"), "Stops and forgets the peer's sampler; False when none.")
      .def("clear", [](StreamHub& h) {
             GilRelease release;
             h.Clear();
           }, "Stops and forgets every sampler.")
      .def("poll",
           [](StreamHub& h, int timeout_ms) -> py::object {
             std::unique_ptr<libzmq::Frames> frames;
             Status s;
             {
               GilRelease release;
               s = h.Poll(std::max(0, timeout_ms), &frames);
             }
             ThrowIfError(s);
             if (!frames) return py::none();
             py::list out;
             for (size_t i = 0; i < frames->size(); ++i)
               out.append(py::bytes(reinterpret_cast<const char*>(frames->data(i)),
                                    frames->bytes(i)));
             return out;
           },
           py::arg("timeout_ms"), R"doc(
Waits up to timeout_ms (GIL released) for a message: returns its frames (bytes: identity,
then the message), or None at the timeout or when a sampler refused a credit (see
`refusals`). RuntimeError on a socket error.
)doc")
      .def("refusals",
           [](StreamHub& h) {
             py::list out;
             for (auto& [identity, why] : h.Refusals())
               out.append(py::make_tuple(py::bytes(identity), why));
             return out;
           },
           "[(identity, why)] of the samplers that refused their learner's credit (each has "
           "stopped drawing until `remove`).")
      .def("idle_seconds",
           [](StreamHub& h, const py::bytes& identity) {
             std::shared_ptr<StreamSampler> s = h.Find(identity);
             return s ? s->idle_seconds() : -1.0;
           },
           py::arg("identity"), "Seconds since the peer last gave slots back (-1: no sampler).")
      .def("held",
           [](StreamHub& h, const py::bytes& identity) -> int64_t {
             std::shared_ptr<StreamSampler> s = h.Find(identity);
             return s ? s->held() : -1;
           },
           py::arg("identity"), "Slots the peer holds (-1: no sampler).")
      .def("take_counts",
           [](StreamHub& h) {
             StreamCounts& c = h.counts();
             return py::dict(py::arg("stream_batches") = c.batches.exchange(0),
                             py::arg("rows_sampled") = c.rows.exchange(0),
                             py::arg("stream_draw_errors") = c.draw_errors.exchange(0),
                             py::arg("stream_rate_limited") = c.rate_limited.exchange(0),
                             py::arg("stream_send_errors") = c.send_errors.exchange(0));
           },
           "The samplers' counts since the last call (each counted once).");
}

}  // namespace memoire
