// ReadErrorMessage (a sampling stream's ERROR replies) on malformed messages: entries named
// "error", "reason" or "slot" of every kind (None, containers, wrong dtypes) and randomly
// corrupted headers are read without touching a frame the entry does not have; only a
// top-level string or int64 scalar is taken. Run it under sanitizers to see a stray read.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/codec.h"
#include "core/stream_batch.h"
#include "tests/testing.h"

using namespace memoire;

namespace {

struct Msg {
  std::vector<std::string> frames;
  std::vector<codec::Frame> view() const {
    std::vector<codec::Frame> out;
    for (const std::string& f : frames)
      out.push_back({reinterpret_cast<const uint8_t*>(f.data()), f.size()});
    return out;
  }
};

codec::Entry E(const char* name, codec::Kind kind, DType dtype, std::vector<int64_t> shape) {
  codec::Entry e;
  e.name = name;
  e.kind = kind;
  e.dtype = dtype;
  e.shape = std::move(shape);
  return e;
}

// An ERROR message of `entries`; every entry with a frame gets `payload` bytes sized to it.
Msg Encode(std::vector<codec::Entry> entries, char payload = 'x') {
  codec::Message m;
  m.type = codec::MsgType::kError;
  m.entries = std::move(entries);
  CHECK(codec::Finalize(&m).ok());
  Msg out;
  out.frames.emplace_back();
  CHECK(codec::EncodeHeader(m, &out.frames[0]).ok());
  for (const codec::Entry& e : m.entries)
    if (e.frame >= 0) out.frames.push_back(std::string(e.nbytes, payload));
  return out;
}

bool Read(const Msg& m, std::string* kind, std::string* reason, int64_t* slot) {
  const auto fr = m.view();
  return ReadErrorMessage(fr.data(), fr.size(), kind, reason, slot);
}

}  // namespace

TEST(EntriesWithoutFramesAreNeverRead) {
  using codec::Kind;
  std::string kind = "stale", reason = "stale";
  int64_t slot = 7;
  // "error" a None, "reason" a list of one string, "slot" a dict: nothing is taken from them.
  Msg m = Encode({E("error", Kind::kNone, DType::kUInt8, {}),
                  E("reason", Kind::kList, DType::kUInt8, {1}),
                  E("", Kind::kStr, DType::kUInt8, {3}),
                  E("slot", Kind::kDict, DType::kUInt8, {0})});
  CHECK(Read(m, &kind, &reason, &slot));
  CHECK(kind.empty() && reason.empty() && slot == -1);
  // Wrong dtypes and kinds: a float slot, a bytes error, an int64 array slot.
  m = Encode({E("error", Kind::kBytes, DType::kUInt8, {2}),
              E("slot", Kind::kScalar, DType::kFloat64, {}),
              E("reason", Kind::kStr, DType::kUInt8, {0})});
  CHECK(Read(m, &kind, &reason, &slot));
  CHECK(kind.empty() && reason.empty() && slot == -1);
  m = Encode({E("slot", Kind::kArray, DType::kInt64, {1})});
  CHECK(Read(m, &kind, &reason, &slot) && slot == -1);
  // A well-formed one is read.
  m = Encode({E("error", Kind::kStr, DType::kUInt8, {5}), E("reason", Kind::kStr, DType::kUInt8, {2}),
              E("slot", Kind::kScalar, DType::kInt64, {})}, 'a');
  std::memset(&m.frames[3][0], 0, 8);
  m.frames[3][0] = 3;
  CHECK(Read(m, &kind, &reason, &slot));
  CHECK(kind == "aaaaa" && reason == "aa" && slot == 3);
  // Not an ERROR, missing frames, an empty message: false.
  Msg short_of_frames = m;
  short_of_frames.frames.pop_back();
  CHECK(!Read(short_of_frames, &kind, &reason, &slot));
  CHECK(!ReadErrorMessage(nullptr, 0, &kind, &reason, &slot));
}

TEST(CorruptedErrorMessagesAreRefusedOrReadSafely) {
  using codec::Kind;
  const Msg good = Encode({E("error", Kind::kStr, DType::kUInt8, {9}),
                           E("reason", Kind::kStr, DType::kUInt8, {30}),
                           E("slot", Kind::kScalar, DType::kInt64, {}),
                           E("extra", Kind::kList, DType::kUInt8, {2}),
                           E("", Kind::kNone, DType::kUInt8, {}),
                           E("", Kind::kStr, DType::kUInt8, {4})});
  std::mt19937_64 rng(24);
  int read = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    Msg m = good;
    std::string& h = m.frames[0];
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) h[rng() % h.size()] = static_cast<char>(rng());
    if (rng() % 8 == 0) m.frames.resize(rng() % (m.frames.size() + 1));
    if (rng() % 8 == 0 && m.frames.size() > 1) m.frames[1 + rng() % (m.frames.size() - 1)].resize(rng() % 40);
    std::string kind, reason;
    int64_t slot = 0;
    if (!Read(m, &kind, &reason, &slot)) continue;
    ++read;
    CHECK(kind.size() <= 64 && reason.size() <= 64);  // only from frames that came
  }
  CHECK(read > 0);  // some corruptions leave a well-formed ERROR (a name byte, say)
}

TEST_MAIN()
