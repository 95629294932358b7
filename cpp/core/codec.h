// Codec: memoire's wire format, version 1. No Python, no sockets: it turns a table of named
// values into a header frame and checks a received header against the sizes of the frames that
// came with it. The raw bytes of arrays travel as separate frames (ZeroMQ multipart), so large
// arrays are never copied into the header.
//
// Message = one header frame + one data frame per data-bearing entry, in table order.
//
// Header frame, all integers little-endian:
//   offset size  field
//   0      4     magic "MMRW"
//   4      2     version (uint16)            this code speaks kWireVersion = 1
//   6      1     type (uint8, MsgType)
//   7      1     flags (uint8, per type)
//   8      4     n_entries (uint32)
//   12     4     table_bytes (uint32)        bytes of the entry table after this 24-byte prefix
//   16     8     payload_bytes (uint64)      sum of the data frame sizes
//   24     ...   entry table: n_entries entries, each
//                  kind (uint8, Kind) | dtype (uint8, DType) | ndim (uint8, <= 8) |
//                  name_len (uint8) | name (name_len bytes, UTF-8) | shape (ndim x uint64)
//
// Kinds. kArray, kScalar, kStr, kBytes carry one data frame of exactly
// prod(shape) * itemsize(dtype) bytes (kScalar: ndim 0; kStr/kBytes: uint8, ndim 1). kNone,
// kList, kTuple, kDict carry no frame; containers have ndim 1 and shape[0] = number of children,
// which follow in pre-order (dict children are named by their keys). The top level is an
// implicit dict of n top-level values: the table is a forest and must be consumed exactly.
//
// Decoding checks: magic, version, type, every length and count against the header frame, every
// dtype code, ndim, shape product (overflow) against the frame sizes, the tree structure (depth,
// counts), and total size against Limits. A bad message yields kDataLoss with a reason.
//
// Thread safety: pure functions over caller-owned memory; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace memoire {
namespace codec {

constexpr uint16_t kWireVersion = 1;
constexpr char kMagic[4] = {'M', 'M', 'R', 'W'};
constexpr size_t kPrefixBytes = 24;
constexpr int kMaxNdim = 8;
constexpr int kMaxDepth = 32;

enum class MsgType : uint8_t {
  kHello = 1,       // client -> server: handshake request (version, uuid)
  kHelloReply = 2,  // server -> client: schema and settings
  kCounter = 3,     // client -> server: cumulative episode and step counts
  kCounterReply = 4,
  kCache = 5,       // client -> server: a prioritized cache (cache mode)
  kChunk = 6,       // client -> server: part of an episode (central mode)
  kLog = 7,         // client -> server: a log line
  kPub = 8,         // server -> clients: bytes under a topic
  kCall = 9,        // remote call of a hosted object's method
  kCallReply = 10,
  kError = 11,      // a reply that reports a rejected request
  kStream = 12,     // sampling stream control, both ways (open, credit, priorities, layout)
  kStreamBatch = 13,  // server -> learner: one batch of a sampling stream (core/stream_batch.h)
  kKeepalive = 14,    // actor -> chunk ingest: "still here" on an idle data channel
};
constexpr uint8_t kMaxMsgType = 14;

enum class Kind : uint8_t {
  kArray = 0, kScalar, kStr, kBytes, kNone, kList, kTuple, kDict,
};
constexpr uint8_t kNumKinds = 8;
inline bool HasFrame(Kind k) { return static_cast<uint8_t>(k) <= static_cast<uint8_t>(Kind::kBytes); }
inline bool IsContainer(Kind k) { return k == Kind::kList || k == Kind::kTuple || k == Kind::kDict; }
const char* KindName(Kind k);
const char* MsgTypeName(uint8_t t);

// The bytes of one received frame (owned elsewhere).
struct Frame {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
};

struct Entry {
  std::string name;
  Kind kind = Kind::kArray;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  int64_t frame = -1;   // index of its data frame among the data frames; -1 when none
  uint64_t nbytes = 0;  // bytes of its data frame
  int depth = 0;        // 0 for top-level entries (set by Finalize and DecodeHeader)
};

struct Message {
  uint16_t version = kWireVersion;
  MsgType type = MsgType::kError;
  uint8_t flags = 0;
  std::vector<Entry> entries;  // pre-order
  int64_t num_frames() const;  // data frames
};

struct Limits {
  uint64_t max_payload_bytes = uint64_t(1) << 32;  // sum of data frames
  uint32_t max_entries = 65536;
  uint32_t max_table_bytes = 1 << 22;
};

// Fills `frame` and `nbytes` of each entry and checks the table (tree shape, kinds, dtypes,
// ndim, names <= 255 bytes). kInvalidArgument on a table that cannot be encoded.
Status Finalize(Message* m);

// Writes the header frame of a finalized message into *out.
Status EncodeHeader(const Message& m, std::string* out);

// Reads magic and version only: true when `data` starts like a memoire header (any version).
bool PeekVersion(const uint8_t* data, size_t size, uint16_t* version, uint8_t* type);

// True when `header` starts like a current-version header of a message of `type`.
bool IsCurrent(const Frame& header, MsgType type);

// Parses and checks a header frame against the sizes of the `n_frames` data frames that came
// after it. On success *out holds the table; on failure *out is unspecified and the Status
// (kDataLoss) says what was wrong.
Status DecodeHeader(const uint8_t* data, size_t size, const uint64_t* frame_sizes, size_t n_frames,
                    const Limits& limits, Message* out);

// An expected top-level array: name, dtype and shape; a dimension of -1 matches any size but
// all -1 dimensions of one check must agree (the batch size).
struct ArraySpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  bool optional = false;
};

// Checks that every top-level kArray/kScalar entry named in `specs` matches, that required ones
// are present, and (unless allow_extra) that no other top-level entry exists. On success
// *batch holds the agreed -1 dimension (or -1 when no spec had one).
Status CheckArrays(const Message& m, const std::vector<ArraySpec>& specs, bool allow_extra,
                   int64_t* batch);

}  // namespace codec
}  // namespace memoire
