// UnstackStreamBatch: a STREAM_BATCH message against a layout the input chooses (its first
// four bytes, fixtures.h StreamLayoutOf: batch size, frame stack, multi-step, the stack flags,
// compressed states), into parts of exactly their sizes, with a scratch and without one (the
// decoded rows then live in the call). Both runs agree: same status, same parts.
#include <memory>
#include <vector>

#include "core/stream_batch.h"
#include "fuzz/fixtures.h"
#include "fuzz/fuzz_input.h"

using namespace memoire;

namespace {

constexpr int F = protocol::kNumFields;

// The learner's parts, each its own allocation of exactly its bytes.
struct Parts {
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<uint8_t*> ptrs;
  explicit Parts(const StreamLayout& layout) {
    const int64_t n = layout.batch_size;
    for (int side = 0; side < 2; ++side)
      for (int f = 0; f < F; ++f)
        bufs.emplace_back(layout.flags[side * F + f]
                              ? n * layout.frame_stack * layout.schema.field(f).bytes()
                              : 0);
    for (size_t b : {sizeof(float), sizeof(double), size_t{1}, sizeof(int64_t)})
      bufs.emplace_back(n * b);
    bufs.emplace_back(8);
    bufs.emplace_back(8);
    for (auto& b : bufs) ptrs.push_back(b.data());
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memoire_fuzz::Input in(data, size);
  const uint8_t sizes = in.U8();
  const uint16_t flags = in.U16();
  const uint8_t compressed = in.U8();
  const StreamLayout layout = memoire_fuzz::StreamLayoutOf(sizes, flags, compressed);
  FUZZ_ASSERT(layout.Check().ok());
  const memoire_fuzz::Message msg = memoire_fuzz::ReadMessage(in);
  const std::vector<codec::Frame> frames = msg.view();
  codec::Limits limits;
  limits.max_payload_bytes = 1 << 20;
  Parts a(layout), b(layout);
  int64_t seq_a = -1, seq_b = -1;
  const Status without = UnstackStreamBatch(frames.data(), frames.size(), layout, limits,
                                            a.ptrs.data(), &seq_a, nullptr);
  UnstackScratch scratch;
  const Status with = UnstackStreamBatch(frames.data(), frames.size(), layout, limits,
                                         b.ptrs.data(), &seq_b, &scratch);
  FUZZ_ASSERT(without.ok() == with.ok());
  if (!with.ok()) {
    FUZZ_ASSERT(with.code() == Code::kDataLoss && without.code() == Code::kDataLoss);
    return 0;
  }
  FUZZ_ASSERT(seq_a == seq_b);
  FUZZ_ASSERT(a.bufs == b.bufs);
  return 0;
}
