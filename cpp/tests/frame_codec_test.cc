// The LZ4 block codec (core/frame_codec.h) and CompressedRows: round trips of compressible,
// periodic, incompressible, empty and tiny inputs; hand-made blocks of the public format;
// truncated and corrupted blocks refused without reading or writing out of bounds (the
// decoder writes into buffers of the exact size, so ASan builds catch any stray access).
// Where the reference LZ4 library is installed (liblz4.so.1, loaded at run time: never a build
// dependency), blocks are exchanged with it both ways.
#include "core/frame_codec.h"

#include <dlfcn.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/compressed_rows.h"
#include "tests/testing.h"

using namespace memoire;

namespace {

std::vector<uint8_t> Compress(const std::vector<uint8_t>& raw) {
  std::vector<uint8_t> out(lz4::CompressBound(raw.size()));
  out.resize(lz4::Compress(raw.data(), raw.size(), out.data()));
  return out;
}

// Decodes into a buffer of exactly `size` bytes (heap, so out-of-bounds writes are caught).
Status Decode(const std::vector<uint8_t>& block, size_t size, std::vector<uint8_t>* out) {
  out->assign(size, 0xAB);
  std::vector<uint8_t> src(block);  // exact-size copy: reads past it are caught too
  return lz4::Decompress(src.data(), src.size(), out->data(), size);
}

bool RoundTrips(const std::vector<uint8_t>& raw) {
  const std::vector<uint8_t> block = Compress(raw);
  if (block.size() > lz4::CompressBound(raw.size())) return false;
  std::vector<uint8_t> back;
  return Decode(block, raw.size(), &back).ok() && back == raw;
}

// An Atari-like screen: a flat background, a band, a few sprites.
std::vector<uint8_t> Screen(int i) {
  std::vector<uint8_t> f(84 * 84, 40);
  for (int c = 0; c < 84; ++c) f[70 * 84 + c] = 120;
  for (int s = 0; s < 3; ++s) {
    const int r0 = (i * (s + 1) * 7) % 76, c0 = (i * 3 + s * 20) % 76;
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c) f[(r0 + r) * 84 + c0 + c] = static_cast<uint8_t>(200 + s);
  }
  return f;
}

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(g());
  return v;
}

}  // namespace

TEST(RoundTripsEmptyTinyAndZeros) {
  for (size_t n = 0; n <= 40; ++n) {
    CHECK(RoundTrips(std::vector<uint8_t>(n, 0)));
    CHECK(RoundTrips(Random(n, static_cast<uint32_t>(n))));
  }
  CHECK(Compress({}).size() == 1);  // one token: no literals, no match
  CHECK(RoundTrips(std::vector<uint8_t>(7056, 0)));
  CHECK(RoundTrips(std::vector<uint8_t>(1 << 20, 7)));  // matches longer than 255 + 15
}

TEST(RoundTripsScreensAndCompressesThem) {
  size_t raw = 0, packed = 0;
  for (int i = 0; i < 50; ++i) {
    const std::vector<uint8_t> f = Screen(i);
    CHECK(RoundTrips(f));
    raw += f.size();
    packed += Compress(f).size();
  }
  CHECK(packed * 5 < raw);  // several-fold on screens
}

TEST(RoundTripsPeriodicData) {
  // Overlapping matches of every short period (the decoder's piecewise copy).
  for (size_t period = 1; period <= 40; ++period) {
    std::vector<uint8_t> v(3000);
    for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<uint8_t>((k % period) * 37 + 1);
    CHECK(RoundTrips(v));
    CHECK(Compress(v).size() < v.size() / 4);
  }
}

TEST(RoundTripsIncompressibleAndMixedData) {
  for (size_t n : {13u, 100u, 255u, 270u, 7056u, 100000u}) {
    const std::vector<uint8_t> v = Random(n, 99);
    CHECK(RoundTrips(v));
    CHECK(Compress(v).size() <= lz4::CompressBound(n));
  }
  // Random literals between repeats, and repeats farther back than the format's 64 KiB.
  std::vector<uint8_t> v = Random(200000, 5);
  for (size_t k = 0; k + 1000 < v.size(); k += 3000) std::memcpy(&v[k + 500], &v[k], 400);
  std::memcpy(&v[150000], &v[1000], 5000);
  CHECK(RoundTrips(v));
}

TEST(DecodesHandMadeBlocks) {
  // "abc", then a match at offset 3 of 9 bytes (token 0x35), then an empty last sequence.
  std::vector<uint8_t> out;
  CHECK(Decode({0x35, 'a', 'b', 'c', 0x03, 0x00, 0x00}, 12, &out).ok());
  CHECK(std::memcmp(out.data(), "abcabcabcabc", 12) == 0);
  // 20 literals: 15 in the token, 5 in one continuation byte.
  std::vector<uint8_t> b{0xF0, 5};
  for (int k = 0; k < 20; ++k) b.push_back(static_cast<uint8_t>('A' + k));
  CHECK(Decode(b, 20, &out).ok() && out[19] == 'A' + 19);
  // A run of one byte: 1 literal, offset 1, match 4 + 15 + 255 + 1 = 275 bytes.
  CHECK(Decode({0x1F, 'z', 0x01, 0x00, 255, 1, 0x00}, 276, &out).ok());
  CHECK(out == std::vector<uint8_t>(276, 'z'));
  CHECK(Decode({0x00}, 0, &out).ok());  // the empty block
}

TEST(RefusesMalformedBlocks) {
  std::vector<uint8_t> out;
  CHECK(!Decode({}, 0, &out).ok());                                   // no token
  CHECK(!Decode({0x00}, 1, &out).ok());                               // decodes too little
  CHECK(!Decode({0x30, 'a', 'b'}, 3, &out).ok());                     // literals past the end
  CHECK(!Decode({0x20, 'a', 'b'}, 1, &out).ok());                     // literals past dst
  CHECK(!Decode({0x10, 'a', 0x00, 0x00, 0x00}, 5, &out).ok());        // offset 0
  CHECK(!Decode({0x10, 'a', 0x02, 0x00, 0x00}, 5, &out).ok());        // before the start
  CHECK(!Decode({0x10, 'a', 0x01}, 5, &out).ok());                    // offset cut short
  CHECK(!Decode({0x1F, 'a', 0x01, 0x00}, 100, &out).ok());            // length cut short
  CHECK(!Decode({0x1F, 'a', 0x01, 0x00, 255, 255, 0, 0x00}, 30, &out).ok());  // past dst
  CHECK(!Decode({0xF0, 255, 255}, 600, &out).ok());                   // literal length cut
  CHECK(!Decode({0x10, 'a', 0x01, 0x00, 0x00, 0xAA}, 5, &out).ok());  // trailing bytes
  const std::vector<uint8_t> screen = Screen(3);
  const std::vector<uint8_t> block = Compress(screen);
  // Every truncation is refused.
  for (size_t k = 0; k < block.size(); ++k) {
    const std::vector<uint8_t> cut(block.begin(), block.begin() + k);
    CHECK(!Decode(cut, screen.size(), &out).ok());
  }
  // A wrong expected size is refused both ways.
  CHECK(!Decode(block, screen.size() - 1, &out).ok());
  CHECK(!Decode(block, screen.size() + 1, &out).ok());
  // Random damage: refused or decoded within bounds, never a crash (ASan checks the bounds).
  std::mt19937 g(1);
  int refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> bad(block);
    for (int k = 0; k < 1 + trial % 4; ++k) bad[g() % bad.size()] = static_cast<uint8_t>(g());
    refused += !Decode(bad, screen.size(), &out).ok();
  }
  CHECK(refused > 1000);
}

TEST(CompressedRowsStoreDecodeAndAccount) {
  const size_t rb = 84 * 84;
  CompressedRows rows(5, rb);
  CHECK(rows.allocated() && rows.stored_bytes() == 0);
  std::vector<uint8_t> src;
  for (int i = 0; i < 3; ++i) {
    const std::vector<uint8_t> f = Screen(i);
    src.insert(src.end(), f.begin(), f.end());
  }
  const std::vector<uint8_t> noise = Random(rb, 4);
  src.insert(src.end(), noise.begin(), noise.end());
  std::vector<CompressedRows::Blob> blobs = CompressedRows::Encode(src.data(), 4, rb);
  CHECK(blobs.size() == 4 && blobs[0].size < rb / 5 && blobs[3].size == rb);  // noise: raw
  size_t sizes[4];
  for (int k = 0; k < 4; ++k) {
    sizes[k] = blobs[k].size;
    rows.Put(k, std::move(blobs[k]));
  }
  CHECK(rows.stored_bytes() == sizes[0] + sizes[1] + sizes[2] + sizes[3]);
  const int64_t slots[5] = {3, 0, 2, 1, 0};
  std::vector<uint8_t> out(5 * rb);
  CHECK(rows.Decode(slots, 5, out.data()).ok());
  for (int k = 0; k < 5; ++k)
    CHECK(std::memcmp(out.data() + k * rb, src.data() + slots[k] * rb, rb) == 0);
  // A null source encodes zeros; replacing a row and clearing one keep the count exact.
  std::vector<CompressedRows::Blob> zero = CompressedRows::Encode(nullptr, 1, rb);
  const size_t zero_bytes = zero[0].size;
  rows.Put(1, std::move(zero[0]));
  const int64_t one = 1;
  CHECK(rows.Decode(&one, 1, out.data()).ok() && out[0] == 0 && out[rb - 1] == 0);
  CHECK(rows.stored_bytes() == sizes[0] + zero_bytes + sizes[2] + sizes[3]);
  rows.Clear(3);
  CHECK(rows.stored_bytes() == sizes[0] + zero_bytes + sizes[2]);
  const int64_t empty = 4;
  CHECK(!rows.Decode(&empty, 1, out.data()).ok());  // never written
  CHECK(!rows.Decode(slots, 1, out.data()).ok());   // slot 3 cleared
}

TEST(ExchangesBlocksWithTheReferenceLz4WhereInstalled) {
  void* lib = dlopen("liblz4.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("  (liblz4.so.1 not installed: the cross-check with the reference is skipped)\n");
    return;
  }
  using CompressFn = int (*)(const char*, char*, int, int);
  using DecompressFn = int (*)(const char*, char*, int, int);
  auto ref_compress = reinterpret_cast<CompressFn>(dlsym(lib, "LZ4_compress_default"));
  auto ref_decompress = reinterpret_cast<DecompressFn>(dlsym(lib, "LZ4_decompress_safe"));
  CHECK(ref_compress != nullptr && ref_decompress != nullptr);
  if (ref_compress == nullptr || ref_decompress == nullptr) return;
  std::vector<std::vector<uint8_t>> inputs = {{}, {7}, std::vector<uint8_t>(12, 1),
                                              std::vector<uint8_t>(13, 1), Random(7056, 8),
                                              std::vector<uint8_t>(100000, 3)};
  for (int i = 0; i < 20; ++i) inputs.push_back(Screen(i));
  std::vector<uint8_t> periodic(5000);
  for (size_t k = 0; k < periodic.size(); ++k) periodic[k] = static_cast<uint8_t>(k % 7);
  inputs.push_back(periodic);
  for (const std::vector<uint8_t>& raw : inputs) {
    const int n = static_cast<int>(raw.size());
    // Ours, decoded by the reference.
    const std::vector<uint8_t> ours = Compress(raw);
    std::vector<uint8_t> back(raw.size() + 1);
    CHECK(ref_decompress(reinterpret_cast<const char*>(ours.data()),
                         reinterpret_cast<char*>(back.data()), static_cast<int>(ours.size()),
                         n) == n);
    CHECK(raw.empty() || std::memcmp(back.data(), raw.data(), raw.size()) == 0);
    // The reference's, decoded by ours.
    std::vector<uint8_t> theirs(lz4::CompressBound(raw.size()));
    const int size = ref_compress(reinterpret_cast<const char*>(raw.data()),
                                  reinterpret_cast<char*>(theirs.data()), n,
                                  static_cast<int>(theirs.size()));
    CHECK(size > 0);
    theirs.resize(static_cast<size_t>(size > 0 ? size : 0));
    std::vector<uint8_t> mine;
    CHECK(Decode(theirs, raw.size(), &mine).ok() && mine == raw);
  }
  dlclose(lib);
}

TEST_MAIN()
