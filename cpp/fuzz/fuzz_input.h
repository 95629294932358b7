// What every fuzz target (cpp/fuzz/*_fuzz.cc) shares: reading libFuzzer's bytes as numbers,
// byte strings and multipart messages, and writing them (the corpus generator,
// make_corpus.cc). Exhausted input reads as zeros and empty strings, so every byte string is
// a valid input and the fuzzer never wastes a run on a framing error of our own.
//
// A message on the wire is a header frame plus data frames (ZeroMQ multipart, core/codec.h).
// In a fuzz input it is: u8 frame count (at most kMaxFrames), then per frame a u32 size
// (little-endian, cut to what is left) and its bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/codec.h"

namespace memoire_fuzz {

constexpr size_t kMaxFrames = 64;

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  size_t left() const { return n_; }
  uint8_t U8() { return static_cast<uint8_t>(Le(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Le(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Le(4)); }
  uint64_t U64() { return Le(8); }
  double F64() {
    const uint64_t bits = U64();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }
  // Up to k bytes (fewer when the input ends).
  std::string Bytes(size_t k) {
    k = std::min(k, n_);
    std::string s(reinterpret_cast<const char*>(p_), k);
    p_ += k;
    n_ -= k;
    return s;
  }
  // Exactly k bytes, zero-padded past the end of the input.
  std::string Exactly(size_t k) {
    std::string s = Bytes(k);
    s.resize(k, '\0');
    return s;
  }

 private:
  uint64_t Le(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes && n_ > 0; ++i, ++p_, --n_) v |= uint64_t{*p_} << (8 * i);
    return v;
  }
  const uint8_t* p_;
  size_t n_;
};

// A multipart message: its frames own their bytes; view() gives the codec's frames.
struct Message {
  std::vector<std::string> frames;
  std::vector<memoire::codec::Frame> view() const {
    std::vector<memoire::codec::Frame> out;
    for (const std::string& f : frames)
      out.push_back({reinterpret_cast<const uint8_t*>(f.data()), f.size()});
    return out;
  }
};

inline Message ReadMessage(Input& in) {
  Message m;
  const size_t count = std::min<size_t>(in.U8(), kMaxFrames);
  for (size_t i = 0; i < count; ++i) m.frames.push_back(in.Bytes(in.U32()));
  return m;
}

// ---- writing (the corpus generator)
inline void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void PutF64(std::string* out, double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof d);
  PutLe(out, bits, 8);
}
inline void PutMessage(std::string* out, const Message& m) {
  PutLe(out, m.frames.size(), 1);
  for (const std::string& f : m.frames) {
    PutLe(out, f.size(), 4);
    out->append(f);
  }
}
// A message from a header and data frames (views of the encoder's buffers).
inline Message Owned(const std::string& header, const std::vector<memoire::codec::Frame>& data) {
  Message m;
  m.frames.push_back(header);
  for (const memoire::codec::Frame& f : data)
    m.frames.emplace_back(reinterpret_cast<const char*>(f.data), f.size);
  return m;
}

// A failed invariant: a crash libFuzzer reports with its input.
#define FUZZ_ASSERT(cond)                                                 \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "%s:%d: FUZZ_ASSERT(%s)\n", __FILE__, __LINE__, #cond); \
      __builtin_trap();                                                   \
    }                                                                     \
  } while (0)

}  // namespace memoire_fuzz
