// StreamRing: how a shared-memory sampling stream's two processes tell each other about
// slots without a message per batch. The first bytes of the stream's mapping (Bytes(slots),
// before the slots) hold two single-producer rings of `slots` entries each:
//
//   notices  server -> learner: {seq, slot, error_bytes}: batch `seq` is in `slot`, or, with
//            error_bytes > 0, the draw failed and spent `slot`, whose first error_bytes bytes
//            hold the reason (UTF-8, at most kMaxErrorBytes);
//   credits  learner -> server: a slot the learner is done with (the server may write it).
//
// Each ring has a head (entries published so far, a 32-bit counter that wraps) that only its
// producer writes, and a count of sleeping consumers. A consumer about to sleep counts itself
// in its waiters and sleeps on a word the other side changes (a futex, shared between the
// processes); a producer wakes it only when someone sleeps, so a stream that keeps up makes
// no system call per batch. A slot is in one place at a time (free, in a notice, held, in a
// credit), so neither ring holds more than `slots` entries between honest peers.
//
// The learner also publishes its notice tail (the notices it has taken), so that the server
// keeps only a few batches ready ahead of it (StreamSampler's `ahead`: a batch read soon after
// it was written is still in cache; the slots stay the hard bound, for batches the learner
// holds), and bumps `learner_events` at each notice taken and each credit: the server's
// samplers sleep on that word, waiting for either.
//
// Trust: the server reads only the learner's words (credit head and ring, notice tail,
// events) and checks what matters (the credit head's advance, each slot, as StreamSampler
// does; a notice tail out of range only paces that learner's own stream); the learner checks
// each notice's slot and seq (StreamSource). What either side scribbles elsewhere in the
// control block can cost only a spurious wake-up or a missed one, which the sleepers'
// timeouts bound.
//
// Thread safety: each end's producer calls and consumer calls are each made by one thread at
// a time (the callers' locks); the two ends run in different processes (or threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace memoire {

class StreamRing {
 public:
  static constexpr uint64_t kMagic = 0x31474e4952454d4dull;  // "MMERING1"
  static constexpr uint32_t kVersion = 2;  // 2: the learner's notice tail and events
  static constexpr size_t kMaxErrorBytes = 4000;  // a slot is >= 4096 bytes

  struct Notice {
    int64_t seq = -1;
    int64_t slot = -1;
    int64_t error_bytes = 0;  // > 0: a failed draw, its reason at the slot's start
  };

  // The control block's bytes for `slots` slots: a whole number of 4 KiB pages.
  static size_t Bytes(int64_t slots);
  // Lays out an empty ring in `at` (Bytes(slots) bytes, zeroed or not), for the server.
  static void Init(uint8_t* at, int64_t slots);
  // A ring over a control block that Init laid out (kDataLoss unless its magic, version and
  // capacity are these).
  static Status Attach(uint8_t* at, int64_t slots, StreamRing* out);

  // Byte offsets of the block's words (for tests that play a raw peer).
  struct Offsets {
    size_t notice_head, notice_waiters, credit_head, notice_tail, learner_events, server_waiters,
        notices, credits;
  };
  static Offsets OffsetsOf(int64_t slots);

  StreamRing() = default;
  int64_t capacity() const { return capacity_; }

  // ---- the server's end
  // Publishes a notice (the slot's bytes, the reason's included, must be written before).
  void PublishNotice(int64_t seq, int64_t slot, int64_t error_bytes);
  // Wakes the learner if it sleeps on notices (after one or more PublishNotice).
  void WakeNoticeWaiters();
  // The credits published since the last call, appended to *slots; kDataLoss, taking none,
  // when the head moved by more than the capacity (a learner that is not honest).
  Status TakeCredits(std::vector<int64_t>* slots);
  // Notices published that the learner has not taken yet, as its tail says (0..capacity).
  int64_t Untaken() const;
  // The learner's event count: read it before looking at credits and Untaken, then pass it to
  // WaitLearner, which returns at once if the learner moved in between.
  uint32_t learner_events() const;
  // Sleeps until the learner's event count moves from `seen`, a wake, or timeout_ms; safe
  // beside other threads' TakeCredits.
  void WaitLearner(uint32_t seen, int timeout_ms) const;
  // Wakes every thread sleeping in WaitLearner (the server's own, on stop).
  void WakeServerWaiters();

  // ---- the learner's end
  // The next notice, if one was published (true, *n set: taken, the server is told); false
  // when there is none yet.
  bool PollNotice(Notice* n);
  // Sleeps until a notice beyond those polled is published, a wake, or timeout_ms.
  void WaitNotices(int timeout_ms);
  // Publishes a credit for `slot` and wakes the server's samplers if they sleep.
  void PublishCredit(int64_t slot);

 private:
  struct Control;
  struct NoticeEntry;
  // The learner's end: counts an event (a notice taken, a credit) and wakes sleeping samplers.
  void LearnerMoved();
  Control* control_ = nullptr;
  NoticeEntry* notices_ = nullptr;
  int64_t* credits_ = nullptr;
  int64_t capacity_ = 0;
  // What this end alone keeps (never read back from the shared block): 64-bit counts, of
  // which the shared heads are the low 32 bits.
  uint64_t notice_head_ = 0;  // server: notices published
  uint64_t credit_tail_ = 0;  // server: credits taken
  uint64_t notice_tail_ = 0;  // learner: notices polled
  uint64_t credit_head_ = 0;  // learner: credits published
};

}  // namespace memoire
