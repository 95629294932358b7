#include "core/stream_ring.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <thread>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace memoire {

namespace {

constexpr size_t kPage = 4096;

// Both processes map the block, so the futex is a shared one (no FUTEX_PRIVATE_FLAG).
void FutexWait(uint32_t* word, uint32_t expected, int timeout_ms) {
#ifdef __linux__
  struct timespec ts;
  ts.tv_sec = timeout_ms / 1000;
  ts.tv_nsec = static_cast<long>(timeout_ms % 1000) * 1000000L;
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
#else
  (void)word;
  (void)expected;
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(timeout_ms, 1)));
#endif
}

void FutexWake(uint32_t* word) {
#ifdef __linux__
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

uint32_t Load(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
void Store(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

}  // namespace

// Producers' and consumers' words on separate cache lines.
struct StreamRing::Control {
  uint64_t magic;
  uint32_t version;
  uint32_t capacity;
  alignas(64) uint32_t notice_head;
  alignas(64) uint32_t notice_waiters;
  alignas(64) uint32_t credit_head;
  alignas(64) uint32_t notice_tail;
  alignas(64) uint32_t learner_events;
  alignas(64) uint32_t server_waiters;
};

struct StreamRing::NoticeEntry {
  int64_t seq;
  int64_t slot;
  int64_t error_bytes;
  int64_t reserved;
};

namespace {
constexpr size_t kNoticesAt = 512;
}  // namespace

size_t StreamRing::Bytes(int64_t slots) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(slots, 1));
  const size_t bytes = kNoticesAt + n * sizeof(NoticeEntry) + n * sizeof(int64_t);
  return (bytes + kPage - 1) / kPage * kPage;
}

StreamRing::Offsets StreamRing::OffsetsOf(int64_t slots) {
  Offsets o;
  o.notice_head = offsetof(Control, notice_head);
  o.notice_waiters = offsetof(Control, notice_waiters);
  o.credit_head = offsetof(Control, credit_head);
  o.notice_tail = offsetof(Control, notice_tail);
  o.learner_events = offsetof(Control, learner_events);
  o.server_waiters = offsetof(Control, server_waiters);
  o.notices = kNoticesAt;
  o.credits = kNoticesAt + static_cast<size_t>(slots) * sizeof(NoticeEntry);
  return o;
}

void StreamRing::Init(uint8_t* at, int64_t slots) {
  std::fill(at, at + Bytes(slots), uint8_t(0));
  auto* c = reinterpret_cast<Control*>(at);
  c->capacity = static_cast<uint32_t>(slots);
  c->version = kVersion;
  __atomic_store_n(&c->magic, kMagic, __ATOMIC_RELEASE);
}

Status StreamRing::Attach(uint8_t* at, int64_t slots, StreamRing* out) {
  static_assert(sizeof(Control) <= kNoticesAt, "the control words fit before the notices");
  auto* c = reinterpret_cast<Control*>(at);
  if (slots < 1 || slots > (int64_t(1) << 20))
    return Error(Code::kDataLoss, "stream ring: expected 1..2^20 slots, got ", slots);
  if (__atomic_load_n(&c->magic, __ATOMIC_ACQUIRE) != kMagic || c->version != kVersion ||
      c->capacity != static_cast<uint32_t>(slots))
    return Error(Code::kDataLoss, "stream ring: expected a version ", kVersion, " ring of ",
                 slots, " slots, got version ", c->version, " of ", c->capacity);
  StreamRing r;
  r.control_ = c;
  r.notices_ = reinterpret_cast<NoticeEntry*>(at + kNoticesAt);
  r.credits_ = reinterpret_cast<int64_t*>(at + kNoticesAt + slots * sizeof(NoticeEntry));
  r.capacity_ = slots;
  // A fresh ring's heads are 0: both ends start there (the server's Init came first).
  *out = r;
  return Status::OK();
}

void StreamRing::PublishNotice(int64_t seq, int64_t slot, int64_t error_bytes) {
  NoticeEntry& e = notices_[notice_head_ % static_cast<uint64_t>(capacity_)];
  __atomic_store_n(&e.seq, seq, __ATOMIC_RELAXED);
  __atomic_store_n(&e.slot, slot, __ATOMIC_RELAXED);
  __atomic_store_n(&e.error_bytes, error_bytes, __ATOMIC_RELAXED);
  Store(&control_->notice_head, static_cast<uint32_t>(++notice_head_));
}

void StreamRing::WakeNoticeWaiters() {
  // Pairs with the fence in WaitNotices: either the sleeper sees the new head, or this sees
  // the sleeper counted.
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (__atomic_load_n(&control_->notice_waiters, __ATOMIC_RELAXED) != 0)
    FutexWake(&control_->notice_head);
}

Status StreamRing::TakeCredits(std::vector<int64_t>* slots) {
  // The 32-bit head wraps; counts on this side are 64-bit, so an index never jumps.
  const uint32_t n = Load(&control_->credit_head) - static_cast<uint32_t>(credit_tail_);
  if (n > static_cast<uint32_t>(capacity_))
    return Error(Code::kDataLoss, "stream ring: the learner's credit head moved by ", n,
                 " entries, more than its ", capacity_, " slots");
  for (uint32_t i = 0; i < n; ++i)
    slots->push_back(__atomic_load_n(&credits_[(credit_tail_ + i) % uint64_t(capacity_)],
                                     __ATOMIC_RELAXED));
  credit_tail_ += n;
  return Status::OK();
}

int64_t StreamRing::Untaken() const {
  const uint32_t n = static_cast<uint32_t>(notice_head_) - Load(&control_->notice_tail);
  // A tail beyond the head (wrapped: huge) is the learner's scribble: it paces its own stream.
  return std::min<int64_t>(n, capacity_);
}

uint32_t StreamRing::learner_events() const { return Load(&control_->learner_events); }

void StreamRing::WaitLearner(uint32_t seen, int timeout_ms) const {
  __atomic_fetch_add(&control_->server_waiters, 1, __ATOMIC_SEQ_CST);
  if (Load(&control_->learner_events) == seen)
    FutexWait(&control_->learner_events, seen, timeout_ms);
  __atomic_fetch_sub(&control_->server_waiters, 1, __ATOMIC_SEQ_CST);
}

void StreamRing::WakeServerWaiters() { FutexWake(&control_->learner_events); }

void StreamRing::LearnerMoved() {
  // The event count changes before the waiters are read (pairs with WaitLearner's count then
  // check): either a sleeper sees the new count, or this sees the sleeper counted.
  __atomic_fetch_add(&control_->learner_events, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&control_->server_waiters, __ATOMIC_SEQ_CST) != 0)
    FutexWake(&control_->learner_events);
}

bool StreamRing::PollNotice(Notice* n) {
  if (Load(&control_->notice_head) == static_cast<uint32_t>(notice_tail_)) return false;
  const NoticeEntry& e = notices_[notice_tail_ % static_cast<uint64_t>(capacity_)];
  n->seq = __atomic_load_n(&e.seq, __ATOMIC_RELAXED);
  n->slot = __atomic_load_n(&e.slot, __ATOMIC_RELAXED);
  n->error_bytes = __atomic_load_n(&e.error_bytes, __ATOMIC_RELAXED);
  Store(&control_->notice_tail, static_cast<uint32_t>(++notice_tail_));
  LearnerMoved();
  return true;
}

void StreamRing::WaitNotices(int timeout_ms) {
  __atomic_fetch_add(&control_->notice_waiters, 1, __ATOMIC_SEQ_CST);
  const uint32_t seen = static_cast<uint32_t>(notice_tail_);
  if (Load(&control_->notice_head) == seen) FutexWait(&control_->notice_head, seen, timeout_ms);
  __atomic_fetch_sub(&control_->notice_waiters, 1, __ATOMIC_SEQ_CST);
}

void StreamRing::PublishCredit(int64_t slot) {
  __atomic_store_n(&credits_[credit_head_ % static_cast<uint64_t>(capacity_)], slot,
                   __ATOMIC_RELAXED);
  Store(&control_->credit_head, static_cast<uint32_t>(++credit_head_));
  LearnerMoved();
}

}  // namespace memoire
