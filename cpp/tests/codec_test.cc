// Tests of core/codec: round trips, the byte layout, and rejection of malformed headers
// (every truncation and many single-byte mutations), which must never crash or over-read.
#include "core/codec.h"

#include <cstring>
#include <string>
#include <vector>

#include "tests/testing.h"

using namespace memoire;
using namespace memoire::codec;

namespace {

Entry Arr(const std::string& name, DType t, std::vector<int64_t> shape, Kind k = Kind::kArray) {
  Entry e;
  e.name = name;
  e.kind = k;
  e.dtype = t;
  e.shape = std::move(shape);
  return e;
}

Message Sample() {
  Message m;
  m.type = MsgType::kCache;
  m.flags = 3;
  m.entries.push_back(Arr("prev/s", DType::kUInt8, {4, 2, 84}));
  m.entries.push_back(Arr("weight", DType::kFloat32, {4}));
  m.entries.push_back(Arr("meta", DType::kUInt8, {2}, Kind::kDict));
  m.entries.push_back(Arr("uuid", DType::kUInt64, {}, Kind::kScalar));
  m.entries.push_back(Arr("tag", DType::kUInt8, {5}, Kind::kStr));
  return m;
}

std::vector<uint64_t> Sizes(const Message& m) {
  std::vector<uint64_t> s;
  for (const Entry& e : m.entries)
    if (e.frame >= 0) s.push_back(e.nbytes);
  return s;
}

}  // namespace

TEST(RoundTrip) {
  Message m = Sample();
  CHECK(Finalize(&m).ok());
  CHECK(m.num_frames() == 4);
  CHECK(m.entries[0].nbytes == 4 * 2 * 84);
  CHECK(m.entries[2].frame == -1 && m.entries[3].depth == 1 && m.entries[4].depth == 1);
  std::string h;
  CHECK(EncodeHeader(m, &h).ok());
  CHECK(std::memcmp(h.data(), "MMRW", 4) == 0);
  CHECK(uint8_t(h[4]) == 1 && uint8_t(h[5]) == 0);  // version, little-endian
  CHECK(uint8_t(h[6]) == 5 && uint8_t(h[7]) == 3);
  auto sizes = Sizes(m);
  Message d;
  Status st = DecodeHeader(reinterpret_cast<const uint8_t*>(h.data()), h.size(), sizes.data(),
                           sizes.size(), Limits(), &d);
  CHECK(st.ok());
  CHECK(d.type == MsgType::kCache && d.flags == 3 && d.entries.size() == 5);
  CHECK(d.entries[0].name == "prev/s" && d.entries[0].shape == std::vector<int64_t>({4, 2, 84}));
  CHECK(d.entries[4].kind == Kind::kStr && d.entries[4].frame == 3);
  int64_t batch = 0;
  CHECK(CheckArrays(d, {{"prev/s", DType::kUInt8, {-1, 2, 84}}, {"weight", DType::kFloat32, {-1}}},
                    true, &batch).ok());
  CHECK(batch == 4);
  // Disagreeing batch dimensions, a wrong dtype, a missing entry, an unexpected entry.
  CHECK(!CheckArrays(d, {{"prev/s", DType::kUInt8, {-1, 2, 84}}, {"weight", DType::kFloat32, {5}}}, true, &batch).ok());
  CHECK(!CheckArrays(d, {{"weight", DType::kFloat64, {-1}}}, true, &batch).ok());
  CHECK(!CheckArrays(d, {{"absent", DType::kFloat32, {-1}}}, true, &batch).ok());
  CHECK(CheckArrays(d, {{"absent", DType::kFloat32, {-1}, true}}, true, &batch).ok());
  CHECK(!CheckArrays(d, {{"weight", DType::kFloat32, {-1}}}, false, &batch).ok());
}

TEST(RejectsWrongVersionAndSizes) {
  Message m = Sample();
  CHECK(Finalize(&m).ok());
  std::string h;
  CHECK(EncodeHeader(m, &h).ok());
  auto sizes = Sizes(m);
  Message d;
  std::string v2 = h;
  v2[4] = 2;
  Status st = DecodeHeader(reinterpret_cast<const uint8_t*>(v2.data()), v2.size(), sizes.data(),
                           sizes.size(), Limits(), &d);
  CHECK(!st.ok() && st.code() == Code::kDataLoss);
  CHECK(st.message().find("version 2") != std::string::npos);
  uint16_t ver = 0;
  uint8_t type = 0;
  CHECK(PeekVersion(reinterpret_cast<const uint8_t*>(v2.data()), v2.size(), &ver, &type) && ver == 2);
  // A frame of the wrong size, a missing frame, too large a payload.
  auto wrong = sizes;
  wrong[1] += 1;
  CHECK(!DecodeHeader(reinterpret_cast<const uint8_t*>(h.data()), h.size(), wrong.data(), wrong.size(), Limits(), &d).ok());
  CHECK(!DecodeHeader(reinterpret_cast<const uint8_t*>(h.data()), h.size(), sizes.data(), sizes.size() - 1, Limits(), &d).ok());
  Limits small;
  small.max_payload_bytes = 100;
  st = DecodeHeader(reinterpret_cast<const uint8_t*>(h.data()), h.size(), sizes.data(), sizes.size(), small, &d);
  CHECK(!st.ok() && st.message().find("limit") != std::string::npos);
}

TEST(EveryTruncationAndMutationIsSafe) {
  Message m = Sample();
  CHECK(Finalize(&m).ok());
  std::string h;
  CHECK(EncodeHeader(m, &h).ok());
  auto sizes = Sizes(m);
  Message d;
  for (size_t n = 0; n < h.size(); ++n)  // every strict prefix is rejected
    CHECK(!DecodeHeader(reinterpret_cast<const uint8_t*>(h.data()), n, sizes.data(), sizes.size(), Limits(), &d).ok());
  uint64_t x = 12345;
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {  // random byte mutations: decode or reject, never crash
    std::string b = h;
    for (int k = 0; k < 1 + trial % 4; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      b[(x >> 33) % b.size()] = static_cast<char>(x >> 17);
    }
    Status st = DecodeHeader(reinterpret_cast<const uint8_t*>(b.data()), b.size(), sizes.data(), sizes.size(), Limits(), &d);
    if (st.ok()) {
      ++accepted;
      uint64_t total = 0;  // an accepted table always agrees with the frames
      for (const Entry& e : d.entries)
        if (e.frame >= 0) { CHECK(e.nbytes == sizes[e.frame]); total += e.nbytes; }
      CHECK(total == 4 * 2 * 84 + 16 + 8 + 5);
    }
  }
  CHECK(accepted < 20000);
}

TEST(RejectsBadTrees) {
  Message m;
  m.type = MsgType::kCall;
  m.entries.push_back(Arr("l", DType::kUInt8, {3}, Kind::kList));  // declares 3, has 1
  m.entries.push_back(Arr("", DType::kInt64, {}, Kind::kScalar));
  CHECK(!Finalize(&m).ok());
  Message bad_kind;
  bad_kind.type = MsgType::kCall;
  bad_kind.entries.push_back(Arr("s", DType::kFloat32, {3}, Kind::kStr));
  CHECK(!Finalize(&bad_kind).ok());
  Message deep;
  deep.type = MsgType::kCall;
  for (int i = 0; i < kMaxDepth + 2; ++i) deep.entries.push_back(Arr("", DType::kUInt8, {1}, Kind::kList));
  deep.entries.push_back(Arr("", DType::kUInt8, {}, Kind::kNone));
  CHECK(!Finalize(&deep).ok());
  Message no_type;
  no_type.type = static_cast<MsgType>(0);
  CHECK(!Finalize(&no_type).ok());
}

TEST_MAIN()
