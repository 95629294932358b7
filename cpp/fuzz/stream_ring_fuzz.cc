// StreamRing, the shared-memory stream's control block, with its peer overwriting the block:
// both ends attach to one block (1..8 slots, the first byte) and the input is operations,
// each a byte and its operands:
//   0 the server publishes a notice (seq u8, slot u8, error_bytes u16) and wakes the learner
//   1 the learner polls a notice          2 the learner publishes a credit (slot u8)
//   3 the server takes credits            4 the peer writes bytes anywhere in the block
//                                           (offset u16, length u8, the bytes)
//   5 each end looks and waits 0 ms (Untaken, learner_events, WaitLearner, WaitNotices)
// Whatever the block holds, neither end reads or writes outside it (AddressSanitizer: the
// block is its own allocation), TakeCredits takes at most the capacity (none when it
// refuses), and Untaken stays in [0, capacity].
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/stream_ring.h"
#include "fuzz/fuzz_input.h"

using namespace memoire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memoire_fuzz::Input in(data, size);
  const int64_t slots = 1 + in.U8() % 8;
  const size_t bytes = StreamRing::Bytes(slots);
  // Page-aligned, as a mapping is (the control words are 64-byte aligned).
  std::unique_ptr<uint8_t, decltype(&std::free)> block(
      static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)), &std::free);
  StreamRing::Init(block.get(), slots);
  StreamRing server, learner;
  FUZZ_ASSERT(StreamRing::Attach(block.get(), slots, &server).ok());
  FUZZ_ASSERT(StreamRing::Attach(block.get(), slots, &learner).ok());
  for (int ops = 0; !in.empty() && ops < 512; ++ops) {
    switch (in.U8() % 6) {
      case 0: {
        const int64_t seq = in.U8(), slot = in.U8(), error_bytes = in.U16();
        server.PublishNotice(seq, slot, error_bytes);
        server.WakeNoticeWaiters();
        break;
      }
      case 1: {
        StreamRing::Notice n;
        learner.PollNotice(&n);
        break;
      }
      case 2:
        learner.PublishCredit(in.U8());
        break;
      case 3: {
        std::vector<int64_t> got = {-7};
        const Status s = server.TakeCredits(&got);
        FUZZ_ASSERT(static_cast<int64_t>(got.size()) <= 1 + slots);
        if (!s.ok()) FUZZ_ASSERT(got.size() == 1 && s.code() == Code::kDataLoss);
        break;
      }
      case 4: {
        const size_t at = in.U16() % bytes;
        const std::string scribble = in.Bytes(in.U8());
        std::memcpy(block.get() + at, scribble.data(), std::min(scribble.size(), bytes - at));
        break;
      }
      default: {
        const int64_t untaken = server.Untaken();
        FUZZ_ASSERT(untaken >= 0 && untaken <= slots);
        server.WaitLearner(server.learner_events() + 1, 0);
        learner.WaitNotices(0);
      }
    }
  }
  // A scribbled header: attaching again refuses it or gives a ring of these slots.
  StreamRing again;
  if (StreamRing::Attach(block.get(), slots, &again).ok()) FUZZ_ASSERT(again.capacity() == slots);
  return 0;
}
