// lz4::Decompress on any block into any output size up to 64 KiB (a stored state's block, as a
// checkpoint or a sampling stream brings it), and Compress round-tripping the same bytes.
#include <string>
#include <vector>

#include "core/frame_codec.h"
#include "fuzz/fuzz_input.h"

using namespace memoire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memoire_fuzz::Input in(data, size);
  const size_t out_size = in.U16();  // 0..65535 bytes
  const std::string block = in.Bytes(in.left());
  const auto* src = reinterpret_cast<const uint8_t*>(block.data());
  // Exactly out_size bytes, so AddressSanitizer sees any write past them.
  std::vector<uint8_t> out(out_size);
  const Status s = lz4::Decompress(src, block.size(), out.data(), out.size());
  FUZZ_ASSERT(s.ok() || s.code() == Code::kDataLoss);
  // Any bytes compress to a block that decodes to them.
  std::vector<uint8_t> packed(lz4::CompressBound(block.size()));
  const size_t n = lz4::Compress(src, block.size(), packed.data());
  FUZZ_ASSERT(n >= 1 && n <= packed.size());
  std::vector<uint8_t> back(block.size());
  FUZZ_ASSERT(lz4::Decompress(packed.data(), n, back.data(), back.size()).ok());
  FUZZ_ASSERT(std::equal(back.begin(), back.end(), src));
  return 0;
}
