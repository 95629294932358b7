// Protocol: what memoire's messages carry (wire format version 1), defined once. The framing
// (header frame, entry table, message types) is core/codec.h; this header says which entries
// each message kind holds, the flags it uses and the names of the memory's fields. The Python
// side reads all of it from the bindings (memoire._core.protocol, wrapped by memoire/protocol.py),
// so nothing here is restated in Python.
//
// Messages and their entries (all top-level arrays; "field" is one of kFieldNames):
//   HELLO / HELLO_REPLY  handshake: schema and settings (built in Python, not hot)
//   COUNTER / COUNTER_REPLY  uuid, episodes, steps / total_episodes, total_steps
//   CACHE   (cache mode, actor -> server) a prioritized cache of cache_size transitions:
//           "prev/<field>", "next/<field>"  dtype[cache_size, frame_stack, *shape], for each
//                                           field whose cache flag is set, in field order,
//                                           prev before next (kCachePrev, kCacheNext)
//           kCacheRowColumns                per row: weight, prob, done, id
//           kCacheScalars                   0-d: uuid, num_sampleable, total_weight
//   CHUNK   (actor -> a chunk ingest) part of an episode:
//           the store's row columns         dtype[n, *shape] (the ingest's row spec; for
//                                           memoire's memory each field but q, then
//                                           kMemoryInitW)
//           kChunkScalars                   0-d: uuid, episode, index, multiplier
//           kChunkInfo                      optional, float64[3] on the last chunk
//           flags kChunkLast | kChunkTerminal | kChunkUpdateValue | kChunkUpdateWeight
//   KEEPALIVE (actor -> a chunk ingest) kKeepaliveScalars: the actor's uuid, sent on its data
//           channel when it had nothing to send for its keepalive interval (the receiver's
//           liveness: core/chunk_ingest.h)
//   LOG     uuid, message;  PUB  topic, data;  CALL / CALL_REPLY / ERROR  remote calls
//   STREAM / STREAM_BATCH  a sampling stream: control values (memoire/server/
//           sampling_service.py) / one batch, each distinct row once (core/stream_batch.h)
//
// Thread safety: constants only.
#pragma once

#include <cstdint>

#include "core/codec.h"
#include "core/dtype.h"

namespace memoire {
namespace protocol {

// The memory's fields, in schema order (state, action, reward, prob, value, qvest, info).
constexpr int kNumFields = 7;
constexpr const char* kFieldNames[kNumFields] = {"s", "a", "r", "p", "v", "q", "i"};
constexpr int kStateField = 0;  // the field a memory may store compressed
constexpr int kQvestField = 5;  // computed by the receiving memory: never in a CHUNK

// A named entry of fixed dtype.
struct Column {
  const char* name;
  DType dtype;
};

// CACHE: the prefixes of the stack columns, the per-row columns after them and the 0-d values
// last. A cache's `cache_flags` (2 * kNumFields booleans: prev of each field, then next of
// each field) say which stack columns it carries.
constexpr const char* kCachePrev = "prev/";
constexpr const char* kCacheNext = "next/";
constexpr int kNumCacheRowColumns = 4;
constexpr Column kCacheRowColumns[kNumCacheRowColumns] = {
    {"weight", DType::kFloat32}, {"prob", DType::kFloat64}, {"done", DType::kBool},
    {"id", DType::kInt64}};
constexpr int kNumCacheScalars = 3;
constexpr Column kCacheScalars[kNumCacheScalars] = {
    {"uuid", DType::kUInt64}, {"num_sampleable", DType::kInt64},
    {"total_weight", DType::kFloat64}};

// CHUNK: the 0-d entries after the row columns, the optional info (return, length,
// terminated) and its flags. A memory's rows carry the initial weight of each entry.
constexpr int kNumChunkScalars = 4;
constexpr Column kChunkScalars[kNumChunkScalars] = {
    {"uuid", DType::kUInt64}, {"episode", DType::kInt64}, {"index", DType::kInt64},
    {"multiplier", DType::kFloat32}};
constexpr Column kChunkInfo = {"info", DType::kFloat64};
constexpr int kChunkInfoSize = 3;
constexpr Column kMemoryInitW = {"init_w", DType::kFloat32};
// KEEPALIVE: its 0-d entries (the uuid of the actor's chunks).
constexpr int kNumKeepaliveScalars = 1;
constexpr Column kKeepaliveScalars[kNumKeepaliveScalars] = {{"uuid", DType::kUInt64}};
constexpr uint8_t kChunkLast = 1;          // closes the episode
constexpr uint8_t kChunkTerminal = 2;      // ... as terminated (else truncated)
constexpr uint8_t kChunkUpdateValue = 4;   // compute returns on close
constexpr uint8_t kChunkUpdateWeight = 8;  // compute priorities on close

// What a receiver did with a CHUNK (the chunk ingest's outcome).
enum class IngestOutcome : int {
  kNotChunk = 0,  // not a current-version chunk: decode it another way
  kStaged = 1,    // accepted; the episode is still open
  kCommitted = 2, // accepted, and the episode it closed is stored
  kRejected = 3,  // dropped (counted by reason)
  kKeepalive = 4, // a keepalive: the actor's open stream (if any) was heard from
};

}  // namespace protocol
}  // namespace memoire
