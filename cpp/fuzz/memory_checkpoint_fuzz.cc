// ReplayMemory::LoadFrom: any file (its bytes in a memfd) into a memory of fixtures.h's schema
// and 32 steps, states stored raw or compressed (the input's first byte). In a fuzz build
// (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION) the sections' checksums are not compared, so the
// fuzzer reaches every check behind them. A refused file leaves the memory as it was (its
// checkpoint bytes unchanged); a loaded one samples and saves.
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "core/replay_memory.h"
#include "fuzz/fixtures.h"
#include "fuzz/fuzz_input.h"

using namespace memoire;

namespace {

int FileOf(const std::string& bytes) {
  const int fd = memfd_create("memoire_fuzz", 0);
  FUZZ_ASSERT(fd >= 0);
  FUZZ_ASSERT(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  return fd;
}

std::string Saved(const ReplayMemory& m) {
  const int fd = memfd_create("memoire_fuzz_save", 0);
  FUZZ_ASSERT(fd >= 0);
  FUZZ_ASSERT(m.SaveTo(fd).ok());
  const off_t n = ::lseek(fd, 0, SEEK_END);
  std::string out(static_cast<size_t>(n), '\0');
  FUZZ_ASSERT(::pread(fd, out.data(), out.size(), 0) == n);
  ::close(fd);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memoire_fuzz::Input in(data, size);
  const bool compressed = in.U8() & 1;
  const std::string file = in.Bytes(in.left());
  auto m = memoire_fuzz::MakeMemory(compressed);
  memoire_fuzz::AddEpisode(*m, 0, 5);
  const std::string before = Saved(*m);
  const int fd = FileOf(file);
  const Status s = m->LoadFrom(fd);
  ::close(fd);
  if (!s.ok()) {
    FUZZ_ASSERT(s.code() == Code::kDataLoss);
    FUZZ_ASSERT(Saved(*m) == before);
    return 0;
  }
  if (m->num_sampleable() > 0) {
    const int64_t n = 4;
    const int fs = m->options().frame_stack;
    std::vector<uint8_t> prev(n * fs * 8), next(n * fs * 8), done(n);
    std::vector<float> weight(n);
    ReplayMemory::SampleOut out;
    out.prev[0] = prev.data();
    out.next[0] = next.data();
    out.weight = weight.data();
    out.done = done.data();
    out.frame_stack = fs;
    const Status sampled = m->Sample(n, out);
    FUZZ_ASSERT(sampled.ok() || sampled.code() == Code::kFailedPrecondition);
  }
  memoire_fuzz::AddEpisode(*m, 100, 3);
  Saved(*m);
  return 0;
}
