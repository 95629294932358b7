// ReadErrorMessage: every message a learner's stream receives is looked at by it first. Any
// frames: false, or true with the kind, reason and slot read from frames it checked.
#include <string>
#include <vector>

#include "core/stream_batch.h"
#include "fuzz/fuzz_input.h"

using namespace memoire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memoire_fuzz::Input in(data, size);
  const memoire_fuzz::Message msg = memoire_fuzz::ReadMessage(in);
  const std::vector<codec::Frame> frames = msg.view();
  std::string kind, reason;
  int64_t slot = -2;
  const bool ok = ReadErrorMessage(frames.data(), frames.size(), &kind, &reason, &slot);
  if (ok) {
    size_t payload = 0;
    for (size_t i = 1; i < msg.frames.size(); ++i) payload += msg.frames[i].size();
    FUZZ_ASSERT(kind.size() + reason.size() <= payload);
  } else {
    FUZZ_ASSERT(slot == -2);  // nothing written
  }
  std::string k2, r2;
  FUZZ_ASSERT(ReadErrorMessage(frames.data(), frames.size(), &k2, &r2) == ok);
  return 0;
}
