// Binds core/protocol.h (and the message types of core/codec.h) as memoire._core.protocol:
// the one source of the protocol's constants for the Python side (memoire/protocol.py).
#include "core/protocol.h"

#include <cctype>
#include <string>

#include "bindings/common.h"
#include "core/chunk_ingest.h"
#include "core/codec.h"

namespace memoire {
namespace {

// The chunk ingest still names its flags and outcomes itself (core/chunk_ingest.h); they must
// be the protocol's until it uses these.
static_assert(ChunkIngest::kLast == protocol::kChunkLast, "chunk flag");
static_assert(ChunkIngest::kTerminal == protocol::kChunkTerminal, "chunk flag");
static_assert(ChunkIngest::kUpdateValue == protocol::kChunkUpdateValue, "chunk flag");
static_assert(ChunkIngest::kUpdateWeight == protocol::kChunkUpdateWeight, "chunk flag");
static_assert(static_cast<int>(ChunkIngest::Outcome::kStaged) ==
              static_cast<int>(protocol::IngestOutcome::kStaged), "ingest outcome");
static_assert(static_cast<int>(ChunkIngest::Outcome::kCommitted) ==
              static_cast<int>(protocol::IngestOutcome::kCommitted), "ingest outcome");
static_assert(static_cast<int>(ChunkIngest::Outcome::kRejected) ==
              static_cast<int>(protocol::IngestOutcome::kRejected), "ingest outcome");

std::string Upper(const char* s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

template <int N>
py::tuple ColumnTuples(const protocol::Column (&columns)[N]) {
  py::tuple out(N);
  for (int k = 0; k < N; ++k)
    out[k] = py::make_tuple(columns[k].name, DTypeName(columns[k].dtype));
  return out;
}

}  // namespace

void BindProtocol(py::module_& m) {
  py::module_ p = m.def_submodule("protocol", "core/protocol.h: the protocol's constants.");
  p.attr("WIRE_VERSION") = codec::kWireVersion;
  py::dict types;  // {"HELLO": 1, ...}
  for (int t = 1; t <= codec::kMaxMsgType; ++t) types[py::str(Upper(codec::MsgTypeName(t)))] = t;
  p.attr("MSG_TYPES") = types;
  py::dict kinds;  // {"ARRAY": 0, ...}
  for (int k = 0; k < codec::kNumKinds; ++k)
    kinds[py::str(Upper(codec::KindName(static_cast<codec::Kind>(k))))] = k;
  p.attr("KINDS") = kinds;
  py::tuple fields(protocol::kNumFields);
  for (int f = 0; f < protocol::kNumFields; ++f) fields[f] = protocol::kFieldNames[f];
  p.attr("FIELDS") = fields;
  p.attr("QVEST_FIELD") = protocol::kQvestField;
  p.attr("CACHE_PREV") = protocol::kCachePrev;
  p.attr("CACHE_NEXT") = protocol::kCacheNext;
  p.attr("CACHE_ROW_COLUMNS") = ColumnTuples(protocol::kCacheRowColumns);
  p.attr("CACHE_SCALARS") = ColumnTuples(protocol::kCacheScalars);
  p.attr("CHUNK_SCALARS") = ColumnTuples(protocol::kChunkScalars);
  p.attr("CHUNK_INFO") = py::make_tuple(protocol::kChunkInfo.name, DTypeName(protocol::kChunkInfo.dtype),
                                        protocol::kChunkInfoSize);
  p.attr("MEMORY_INIT_W") = py::make_tuple(protocol::kMemoryInitW.name,
                                           DTypeName(protocol::kMemoryInitW.dtype));
  p.attr("KEEPALIVE_SCALARS") = ColumnTuples(protocol::kKeepaliveScalars);
  p.attr("CHUNK_LAST") = protocol::kChunkLast;
  p.attr("CHUNK_TERMINAL") = protocol::kChunkTerminal;
  p.attr("CHUNK_UPDATE_VALUE") = protocol::kChunkUpdateValue;
  p.attr("CHUNK_UPDATE_WEIGHT") = protocol::kChunkUpdateWeight;
  p.attr("INGEST_STAGED") = static_cast<int>(protocol::IngestOutcome::kStaged);
  p.attr("INGEST_COMMITTED") = static_cast<int>(protocol::IngestOutcome::kCommitted);
  p.attr("INGEST_REJECTED") = static_cast<int>(protocol::IngestOutcome::kRejected);
  p.attr("INGEST_KEEPALIVE") = static_cast<int>(protocol::IngestOutcome::kKeepalive);
}

}  // namespace memoire
