#include "core/codec.h"

#include <cstring>

namespace memoire {
namespace codec {

namespace {

// Little-endian writers and readers, independent of the host's byte order.
void PutU16(std::string* s, uint16_t v) {
  s->push_back(static_cast<char>(v & 0xff));
  s->push_back(static_cast<char>(v >> 8));
}
void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLE(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// True when s is well-formed UTF-8 (names become Python str).
bool ValidUtf8(const std::string& s) {
  static const uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};  // overlong forms are invalid
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    const int n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : -1;
    if (n < 0 || i + n >= s.size() + (n == 0 ? 1 : 0)) return false;
    uint32_t cp = n == 0 ? c : (c & (0x3fu >> n));
    for (int k = 1; k <= n; ++k) {
      const uint8_t d = static_cast<uint8_t>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

// Bytes of an entry's data frame, or an error when the shape product overflows.
Status EntryBytes(const Entry& e, uint64_t* out) {
  uint64_t n = ItemSize(e.dtype);
  for (int64_t d : e.shape) {
    if (d < 0) return Error(Code::kDataLoss, "entry '", e.name, "': negative dimension ", d);
    const uint64_t ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > (uint64_t(1) << 62) / ud)
      return Error(Code::kDataLoss, "entry '", e.name, "': shape product overflows");
    n *= ud;
  }
  *out = n;
  return Status::OK();
}

// Checks one entry's own fields (not its place in the tree).
Status CheckEntry(const Entry& e, Code code) {
  const uint8_t k = static_cast<uint8_t>(e.kind);
  if (k >= kNumKinds) return Error(code, "entry '", e.name, "': unknown kind code ", int(k));
  if (!ValidDType(static_cast<uint8_t>(e.dtype)))
    return Error(code, "entry '", e.name, "': unknown dtype code ", int(static_cast<uint8_t>(e.dtype)));
  if (e.shape.size() > static_cast<size_t>(kMaxNdim))
    return Error(code, "entry '", e.name, "': ndim ", e.shape.size(), " > ", kMaxNdim);
  if (e.name.size() > 255) return Error(code, "entry name longer than 255 bytes");
  if (!ValidUtf8(e.name)) return Error(code, "an entry name is not valid UTF-8");
  for (int64_t d : e.shape)
    if (d < 0) return Error(code, "entry '", e.name, "': negative dimension ", d);
  switch (e.kind) {
    case Kind::kScalar:
      if (!e.shape.empty()) return Error(code, "entry '", e.name, "': a scalar has ndim 0");
      break;
    case Kind::kStr: case Kind::kBytes:
      if (e.dtype != DType::kUInt8 || e.shape.size() != 1)
        return Error(code, "entry '", e.name, "': ", KindName(e.kind), " must be uint8 of ndim 1");
      break;
    case Kind::kNone:
      if (!e.shape.empty()) return Error(code, "entry '", e.name, "': none has ndim 0");
      break;
    case Kind::kList: case Kind::kTuple: case Kind::kDict:
      if (e.shape.size() != 1)
        return Error(code, "entry '", e.name, "': a container has ndim 1 (its child count)");
      break;
    case Kind::kArray:
      break;
  }
  return Status::OK();
}

// Walks the pre-order table, setting depth, frame and nbytes. Every entry must be reached
// exactly once: top-level values, then each container's declared children.
Status WalkTree(std::vector<Entry>* entries, Code code) {
  struct Open { int64_t remaining; };
  std::vector<Open> stack;
  int64_t frame = 0;
  for (Entry& e : *entries) {
    while (!stack.empty() && stack.back().remaining == 0) stack.pop_back();
    if (!stack.empty()) --stack.back().remaining;
    e.depth = static_cast<int>(stack.size());
    MEMOIRE_RETURN_IF_ERROR(CheckEntry(e, code));
    if (HasFrame(e.kind)) {
      Status st = EntryBytes(e, &e.nbytes);
      if (!st.ok()) return Status(code, st.message());
      e.frame = frame++;
    } else {
      e.nbytes = 0;
      e.frame = -1;
    }
    if (IsContainer(e.kind)) {
      if (stack.size() >= static_cast<size_t>(kMaxDepth))
        return Error(code, "entry '", e.name, "': nesting deeper than ", kMaxDepth);
      if (e.shape[0] > static_cast<int64_t>(entries->size()))
        return Error(code, "entry '", e.name, "': declares ", e.shape[0],
                     " children, more than the table holds");
      stack.push_back({e.shape[0]});
    }
  }
  while (!stack.empty() && stack.back().remaining == 0) stack.pop_back();
  if (!stack.empty())
    return Error(code, "table ends inside a container (", stack.back().remaining,
                 " children missing)");
  return Status::OK();
}

}  // namespace

const char* KindName(Kind k) {
  static const char* kNames[kNumKinds] = {"array", "scalar", "str",   "bytes",
                                          "none",  "list",   "tuple", "dict"};
  const uint8_t i = static_cast<uint8_t>(k);
  return i < kNumKinds ? kNames[i] : "invalid";
}

const char* MsgTypeName(uint8_t t) {
  static const char* kNames[kMaxMsgType + 1] = {
      "invalid", "hello", "hello_reply", "counter", "counter_reply", "cache",
      "chunk",   "log",   "pub",         "call",    "call_reply",    "error",
      "stream",  "stream_batch", "keepalive"};
  return t <= kMaxMsgType ? kNames[t] : "invalid";
}

int64_t Message::num_frames() const {
  int64_t n = 0;
  for (const Entry& e : entries) n += HasFrame(e.kind);
  return n;
}

Status Finalize(Message* m) {
  const uint8_t t = static_cast<uint8_t>(m->type);
  if (t == 0 || t > kMaxMsgType)
    return Error(Code::kInvalidArgument, "message type: expected 1..", int(kMaxMsgType), ", got ", int(t));
  return WalkTree(&m->entries, Code::kInvalidArgument);
}

Status EncodeHeader(const Message& m, std::string* out) {
  std::string table;
  for (const Entry& e : m.entries) {
    MEMOIRE_RETURN_IF_ERROR(CheckEntry(e, Code::kInvalidArgument));
    table.push_back(static_cast<char>(e.kind));
    table.push_back(static_cast<char>(e.dtype));
    table.push_back(static_cast<char>(e.shape.size()));
    table.push_back(static_cast<char>(e.name.size()));
    table += e.name;
    for (int64_t d : e.shape) PutU64(&table, static_cast<uint64_t>(d));
  }
  if (table.size() > 0xffffffffu) return Error(Code::kInvalidArgument, "entry table too large");
  uint64_t payload = 0;
  for (const Entry& e : m.entries) payload += e.nbytes;
  out->clear();
  out->reserve(kPrefixBytes + table.size());
  out->append(kMagic, 4);
  PutU16(out, m.version);
  out->push_back(static_cast<char>(m.type));
  out->push_back(static_cast<char>(m.flags));
  PutU32(out, static_cast<uint32_t>(m.entries.size()));
  PutU32(out, static_cast<uint32_t>(table.size()));
  PutU64(out, payload);
  out->append(table);
  return Status::OK();
}

bool PeekVersion(const uint8_t* data, size_t size, uint16_t* version, uint8_t* type) {
  if (size < 8 || std::memcmp(data, kMagic, 4) != 0) return false;
  *version = static_cast<uint16_t>(GetLE(data + 4, 2));
  *type = data[6];
  return true;
}

bool IsCurrent(const Frame& header, MsgType type) {
  uint16_t version = 0;
  uint8_t t = 0;
  return PeekVersion(header.data, header.size, &version, &t) && version == kWireVersion &&
         t == static_cast<uint8_t>(type);
}

Status DecodeHeader(const uint8_t* data, size_t size, const uint64_t* frame_sizes, size_t n_frames,
                    const Limits& limits, Message* out) {
  const Code bad = Code::kDataLoss;
  if (size < kPrefixBytes)
    return Error(bad, "header: expected at least ", kPrefixBytes, " bytes, got ", size);
  if (std::memcmp(data, kMagic, 4) != 0) return Error(bad, "header: bad magic (not a memoire message)");
  const uint16_t version = static_cast<uint16_t>(GetLE(data + 4, 2));
  if (version != kWireVersion)
    return Error(bad, "unsupported wire version ", version, " (this side speaks version ",
                 kWireVersion, ")");
  const uint8_t type = data[6];
  if (type == 0 || type > kMaxMsgType) return Error(bad, "header: unknown message type ", int(type));
  const uint32_t n_entries = static_cast<uint32_t>(GetLE(data + 8, 4));
  const uint32_t table_bytes = static_cast<uint32_t>(GetLE(data + 12, 4));
  const uint64_t payload = GetLE(data + 16, 8);
  if (n_entries > limits.max_entries)
    return Error(bad, "header: ", n_entries, " entries, more than the limit ", limits.max_entries);
  if (table_bytes > limits.max_table_bytes)
    return Error(bad, "header: entry table of ", table_bytes, " bytes, over the limit ",
                 limits.max_table_bytes);
  if (static_cast<uint64_t>(table_bytes) != size - kPrefixBytes)
    return Error(bad, "header: table_bytes says ", table_bytes, " but the frame holds ",
                 size - kPrefixBytes);
  if (payload > limits.max_payload_bytes)
    return Error(bad, "message of ", payload, " payload bytes, over the limit ",
                 limits.max_payload_bytes);
  uint64_t received = 0;
  for (size_t i = 0; i < n_frames; ++i) {
    received += frame_sizes[i];
    if (received > limits.max_payload_bytes)
      return Error(bad, "message frames exceed the limit of ", limits.max_payload_bytes, " bytes");
  }
  if (received != payload)
    return Error(bad, "header: payload_bytes says ", payload, " but the data frames hold ", received);

  Message m;
  m.version = version;
  m.type = static_cast<MsgType>(type);
  m.flags = data[7];
  m.entries.reserve(n_entries);
  const uint8_t* p = data + kPrefixBytes;
  const uint8_t* end = data + size;
  for (uint32_t k = 0; k < n_entries; ++k) {
    if (end - p < 4) return Error(bad, "entry ", k, ": table truncated");
    Entry e;
    e.kind = static_cast<Kind>(p[0]);
    e.dtype = static_cast<DType>(p[1]);
    const uint8_t ndim = p[2];
    const uint8_t name_len = p[3];
    p += 4;
    if (ndim > kMaxNdim) return Error(bad, "entry ", k, ": ndim ", int(ndim), " > ", kMaxNdim);
    if (static_cast<size_t>(end - p) < name_len + 8u * ndim)
      return Error(bad, "entry ", k, ": table truncated");
    e.name.assign(reinterpret_cast<const char*>(p), name_len);
    p += name_len;
    for (int d = 0; d < ndim; ++d, p += 8) {
      const uint64_t dim = GetLE(p, 8);
      if (dim > (uint64_t(1) << 62)) return Error(bad, "entry '", e.name, "': dimension too large");
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    m.entries.push_back(std::move(e));
  }
  if (p != end) return Error(bad, "header: ", end - p, " trailing bytes after the entry table");
  MEMOIRE_RETURN_IF_ERROR(WalkTree(&m.entries, bad));
  if (static_cast<size_t>(m.num_frames()) != n_frames)
    return Error(bad, "message: the table names ", m.num_frames(), " data frames, ", n_frames,
                 " came");
  for (const Entry& e : m.entries)
    if (e.frame >= 0 && frame_sizes[e.frame] != e.nbytes)
      return Error(bad, "entry '", e.name, "' (", KindName(e.kind), " ", DTypeName(e.dtype),
                   "): expected ", e.nbytes, " bytes, its frame holds ", frame_sizes[e.frame]);
  *out = std::move(m);
  return Status::OK();
}

Status CheckArrays(const Message& m, const std::vector<ArraySpec>& specs, bool allow_extra,
                   int64_t* batch) {
  const Code bad = Code::kDataLoss;
  int64_t n = -1;
  std::vector<bool> seen(specs.size(), false);
  for (const Entry& e : m.entries) {
    if (e.depth != 0) continue;
    size_t s = 0;
    while (s < specs.size() && specs[s].name != e.name) ++s;
    if (s == specs.size()) {
      if (allow_extra) continue;
      return Error(bad, MsgTypeName(static_cast<uint8_t>(m.type)), ": unexpected entry '", e.name, "'");
    }
    if (seen[s]) return Error(bad, "entry '", e.name, "' appears twice");
    seen[s] = true;
    const ArraySpec& spec = specs[s];
    bool ok = (e.kind == Kind::kArray || e.kind == Kind::kScalar) && e.dtype == spec.dtype &&
              e.shape.size() == spec.shape.size();
    for (size_t d = 0; ok && d < spec.shape.size(); ++d) {
      if (spec.shape[d] >= 0) {
        ok = e.shape[d] == spec.shape[d];
      } else if (n < 0) {
        n = e.shape[d];
      } else {
        ok = e.shape[d] == n;
      }
    }
    if (!ok) {
      std::string want = DTypeName(spec.dtype);
      want += "[";
      for (size_t d = 0; d < spec.shape.size(); ++d) {
        if (d) want += ",";
        want += spec.shape[d] < 0 ? (n < 0 ? std::string("n") : std::to_string(n))
                                  : std::to_string(spec.shape[d]);
      }
      want += "]";
      std::string got = DTypeName(e.dtype);
      got += "[";
      for (size_t d = 0; d < e.shape.size(); ++d) got += (d ? "," : "") + std::to_string(e.shape[d]);
      got += "]";
      return Error(bad, "entry '", e.name, "': expected ", want, ", got ", KindName(e.kind), " ", got);
    }
  }
  for (size_t s = 0; s < specs.size(); ++s)
    if (!seen[s] && !specs[s].optional)
      return Error(bad, MsgTypeName(static_cast<uint8_t>(m.type)), ": missing entry '",
                   specs[s].name, "'");
  if (batch) *batch = n;
  return Status::OK();
}

}  // namespace codec
}  // namespace memoire
