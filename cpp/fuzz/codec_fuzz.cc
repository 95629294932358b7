// codec::DecodeHeader and codec::CheckArrays: any header frame, with any data frames. A header
// that decodes re-encodes (Finalize, EncodeHeader) to a header that decodes to the same table,
// and CheckArrays against the layouts the receivers use (a chunk's, a stream batch's) never
// reads past what DecodeHeader checked.
#include <string>
#include <vector>

#include "core/codec.h"
#include "fuzz/fuzz_input.h"

using namespace memoire;

namespace {

bool SameTable(const codec::Message& a, const codec::Message& b) {
  if (a.type != b.type || a.flags != b.flags || a.entries.size() != b.entries.size())
    return false;
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const codec::Entry& x = a.entries[i];
    const codec::Entry& y = b.entries[i];
    if (x.name != y.name || x.kind != y.kind || x.dtype != y.dtype || x.shape != y.shape ||
        x.frame != y.frame || x.nbytes != y.nbytes || x.depth != y.depth)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memoire_fuzz::Input in(data, size);
  const uint8_t limit = in.U8();  // small limits, so their checks are reached too
  const memoire_fuzz::Message msg = memoire_fuzz::ReadMessage(in);
  if (msg.frames.empty()) return 0;
  std::vector<uint64_t> sizes;
  for (size_t i = 1; i < msg.frames.size(); ++i) sizes.push_back(msg.frames[i].size());
  codec::Limits limits;
  if (limit & 1) limits.max_payload_bytes = 1 << (limit >> 4);
  if (limit & 2) limits.max_entries = 1 + (limit >> 4);
  if (limit & 4) limits.max_table_bytes = 16 << (limit >> 4);
  const std::string& header = msg.frames[0];
  codec::Message m;
  const Status s = codec::DecodeHeader(reinterpret_cast<const uint8_t*>(header.data()),
                                       header.size(), sizes.data(), sizes.size(), limits, &m);
  if (!s.ok()) {
    FUZZ_ASSERT(s.code() == Code::kDataLoss);
    return 0;
  }
  // What a receiver peeks at agrees with the decoded header.
  uint16_t version = 0;
  uint8_t type = 0;
  FUZZ_ASSERT(codec::PeekVersion(reinterpret_cast<const uint8_t*>(header.data()), header.size(),
                                 &version, &type));
  FUZZ_ASSERT(version == codec::kWireVersion && type == static_cast<uint8_t>(m.type));
  FUZZ_ASSERT(codec::IsCurrent(msg.view()[0], m.type));
  FUZZ_ASSERT(m.num_frames() == static_cast<int64_t>(sizes.size()));
  // Re-encoded, it decodes to the same table.
  codec::Message again = m;
  FUZZ_ASSERT(codec::Finalize(&again).ok());
  std::string encoded;
  FUZZ_ASSERT(codec::EncodeHeader(again, &encoded).ok());
  codec::Message back;
  FUZZ_ASSERT(codec::DecodeHeader(reinterpret_cast<const uint8_t*>(encoded.data()),
                                  encoded.size(), sizes.data(), sizes.size(), limits, &back)
                  .ok());
  FUZZ_ASSERT(SameTable(m, back));
  // The receivers' checks.
  int64_t batch = 0;
  const std::vector<std::vector<codec::ArraySpec>> layouts = {
      {{"s", DType::kUInt8, {-1, 8}}, {"r", DType::kFloat32, {-1, 1}},
       {"uuid", DType::kUInt64, {}}, {"index", DType::kInt64, {}},
       {"info", DType::kFloat64, {3}, /*optional=*/true}},
      {{"seq", DType::kInt64, {}}, {"weight", DType::kFloat32, {-1}},
       {"index", DType::kInt32, {-1, 3}}, {"zrows/s", DType::kUInt8, {-1}, true}},
  };
  for (const auto& spec : layouts)
    for (bool extra : {false, true}) {
      const Status c = codec::CheckArrays(m, spec, extra, &batch);
      FUZZ_ASSERT(c.ok() || c.code() == Code::kDataLoss || c.code() == Code::kInvalidArgument);
    }
  return 0;
}
