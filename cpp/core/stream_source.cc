// The learner's end of a sampling stream: see core/stream_source.h.
#include "core/stream_source.h"

#include <utility>

namespace memoire {

namespace {

constexpr int kSliceMs = 5;  // a waiting receive checks for posts and Stop this often

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

Status StreamSource::MapSlots(const std::string& path, int64_t slots, uint64_t slot_bytes,
                              Options* o) {
  // The server's slots must be exactly this layout's: every view stays inside.
  o->slot_layout = StreamSlotLayout(o->layout);
  if (slots < 1 || slots > (int64_t(1) << 20) || slot_bytes != o->slot_layout.slot_bytes)
    return Error(Code::kDataLoss, "shared memory: expected slots of ", o->slot_layout.slot_bytes,
                 " bytes, got ", slots, " slots of ", slot_bytes);
  std::unique_ptr<ShmRegion> r;
  o->slots_at = StreamRing::Bytes(slots);
  MEMOIRE_RETURN_IF_ERROR(ShmRegion::Open(path, o->slots_at + slot_bytes * slots, &r));
  MEMOIRE_RETURN_IF_ERROR(StreamRing::Attach(r->data(), slots, &o->ring));
  o->shm = std::move(r);
  o->slots = slots;
  return Status::OK();
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

}  // namespace memoire
