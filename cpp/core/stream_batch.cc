#include "core/stream_batch.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "core/gather.h"
#include "core/replay_memory.h"

namespace memoire {

using codec::Entry;
using codec::Frame;
using codec::Kind;
using codec::MsgType;

Status StreamLayout::Check() const {
  if (schema.size() != static_cast<size_t>(protocol::kNumFields))
    return Error(Code::kInvalidArgument, "stream layout: expected ", protocol::kNumFields,
                 " fields, got ", schema.size());
  if (batch_size < 1 || frame_stack < 1 || multi_step < 1)
    return Error(Code::kInvalidArgument, "stream layout: batch_size, frame_stack and multi_step "
                 "must be >= 1, got ", batch_size, ", ", frame_stack, ", ", multi_step);
  return Status::OK();
}

// ---------------------------------------------------------------------- the server's draw

Status ReplayMemory::SampleDistinct(int64_t n, StreamBatch* out,
                                    const std::function<void()>& on_draw) {
  if (n < 1) return Error(Code::kInvalidArgument, "batch_size: expected >= 1, got ", n);
  // Shared, as in Sample: writers wait for the copy; only the draw is one at a time.
  std::shared_lock<RwLock> l(mu_);
  const int fs = opt_.frame_stack;
  const int ms = opt_.multi_step;
  const int shift = ms < fs ? ms : fs;
  const int w = fs + shift;
  // The stream's window was agreed at open: a changed setting would change the layout.
  if (out->window != 0 && out->window != w)
    return Error(Code::kFailedPrecondition, "sample: the stream was opened for windows of ",
                 out->window, " entries, but frame_stack=", fs, " and multi_step=", ms,
                 " now need ", w, ": open a new stream");
  out->n = n;
  out->window = w;
  out->weight.resize(n);
  out->prob.resize(n);
  out->done.resize(n);
  out->id.resize(n);
  SampleOut meta;
  meta.weight = out->weight.data();
  meta.prob = out->prob.data();
  meta.done = out->done.data();
  meta.id = out->id.data();
  std::vector<int64_t> slots(n);
  {
    std::lock_guard<std::mutex> d(draw_mu_);
    MEMOIRE_RETURN_IF_ERROR(DrawLocked(n, meta, slots.data()));
    if (on_draw) on_draw();
  }
  // The window's slots, then each distinct one once (sorted: the gather reads the ring in
  // order).
  std::vector<int64_t> win(static_cast<size_t>(n) * w);
  for (int64_t b = 0; b < n; ++b) {
    const int64_t p = pos(slots[b]);
    for (int k = 0; k < w; ++k) {
      const int64_t at = k < fs ? p - (fs - 1) + k : p + ms - (fs - 1) + (k - shift);
      win[b * w + k] = at % max_step_;
    }
  }
  std::vector<int64_t> uniq(win);
  std::sort(uniq.begin(), uniq.end());
  uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
  const int64_t u = static_cast<int64_t>(uniq.size());
  out->distinct = u;
  out->index.resize(win.size());
  for (size_t i = 0; i < win.size(); ++i)
    out->index[i] = static_cast<int32_t>(
        std::lower_bound(uniq.begin(), uniq.end(), win[i]) - uniq.begin());
  for (int f = 0; f < kNumFields; ++f) {
    if (!out->send[f]) {
      out->rows[f].clear();
      continue;
    }
    const size_t rb = row_bytes(f);
    out->rows[f].resize(static_cast<size_t>(u) * rb);
    uint8_t* dst = out->rows[f].data();
    if (f == kState && states_)
      MEMOIRE_RETURN_IF_ERROR(states_->Decode(uniq.data(), u, dst));
    else
      GatherRows(cols_.data(f), rb, uniq.data(), u, dst);
  }
  out->num_sampleable = sampleable_;
  out->total_weight = tree_.Total();
  return Status::OK();
}

// ---------------------------------------------------------------------- the wire

std::array<uint8_t, protocol::kNumFields> StreamSends(const StreamLayout& layout) {
  std::array<uint8_t, protocol::kNumFields> s{};
  for (int f = 0; f < protocol::kNumFields; ++f) s[f] = layout.sends(f);
  return s;
}

namespace {

Entry Array(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  Entry e;
  e.name = name;
  e.kind = shape.empty() ? Kind::kScalar : Kind::kArray;
  e.dtype = dtype;
  e.shape = std::move(shape);
  return e;
}

}  // namespace

Status EncodeStreamBatch(const StreamBatch& b, const Schema& schema, std::string* header,
                         std::vector<Frame>* data) {
  codec::Message m;
  m.type = MsgType::kStreamBatch;
  data->clear();
  auto add = [&](Entry e, const void* bytes, size_t size) {
    m.entries.push_back(std::move(e));
    data->push_back({static_cast<const uint8_t*>(bytes), size});
  };
  const int64_t n = b.n;
  add(Array("seq", DType::kInt64, {}), &b.seq, sizeof(int64_t));
  add(Array("num_sampleable", DType::kInt64, {}), &b.num_sampleable, sizeof(int64_t));
  add(Array("total_weight", DType::kFloat64, {}), &b.total_weight, sizeof(double));
  add(Array("weight", DType::kFloat32, {n}), b.weight.data(), n * sizeof(float));
  add(Array("prob", DType::kFloat64, {n}), b.prob.data(), n * sizeof(double));
  add(Array("done", DType::kBool, {n}), b.done.data(), n);
  add(Array("id", DType::kInt64, {n}), b.id.data(), n * sizeof(int64_t));
  add(Array("index", DType::kInt32, {n, b.window}), b.index.data(),
      b.index.size() * sizeof(int32_t));
  for (int f = 0; f < protocol::kNumFields; ++f) {
    if (!b.send[f]) continue;
    const Field& fd = schema.field(f);
    std::vector<int64_t> shape{b.distinct};
    shape.insert(shape.end(), fd.shape.begin(), fd.shape.end());
    add(Array(std::string(kStreamRowsPrefix) + protocol::kFieldNames[f], fd.dtype, shape),
        b.rows[f].data(), b.rows[f].size());
  }
  MEMOIRE_RETURN_IF_ERROR(codec::Finalize(&m));
  return codec::EncodeHeader(m, header);
}

namespace {

// The message in `frames`, decoded and checked against its frames.
Status DecodeFrames(const Frame* frames, size_t n_frames, const codec::Limits& limits,
                    codec::Message* m) {
  if (n_frames < 1) return Error(Code::kDataLoss, "stream: empty message");
  std::vector<uint64_t> sizes(n_frames - 1);
  for (size_t i = 1; i < n_frames; ++i) sizes[i - 1] = frames[i].size;
  return codec::DecodeHeader(frames[0].data, frames[0].size, sizes.data(), sizes.size(), limits,
                             m);
}

}  // namespace

Status UnstackStreamBatch(const Frame* frames, size_t n_frames, const StreamLayout& layout,
                          const codec::Limits& limits, uint8_t* const* parts, int64_t* seq) {
  const Code bad = Code::kDataLoss;
  codec::Message m;
  MEMOIRE_RETURN_IF_ERROR(DecodeFrames(frames, n_frames, limits, &m));
  if (m.type != MsgType::kStreamBatch)
    return Error(bad, "stream: expected a stream_batch message, got ",
                 codec::MsgTypeName(static_cast<uint8_t>(m.type)));
  constexpr int F = protocol::kNumFields;
  const int64_t n = layout.batch_size;
  const int fs = layout.frame_stack;
  const int w = layout.window();
  std::vector<codec::ArraySpec> specs = {
      {"seq", DType::kInt64, {}},          {"num_sampleable", DType::kInt64, {}},
      {"total_weight", DType::kFloat64, {}}, {"weight", DType::kFloat32, {n}},
      {"prob", DType::kFloat64, {n}},      {"done", DType::kBool, {n}},
      {"id", DType::kInt64, {n}},          {"index", DType::kInt32, {n, w}}};
  for (int f = 0; f < F; ++f) {
    if (!layout.sends(f)) continue;
    const Field& fd = layout.schema.field(f);
    std::vector<int64_t> shape{-1};  // U, the one free dimension
    shape.insert(shape.end(), fd.shape.begin(), fd.shape.end());
    specs.push_back({std::string(kStreamRowsPrefix) + protocol::kFieldNames[f], fd.dtype, shape});
  }
  int64_t u = -1;
  MEMOIRE_RETURN_IF_ERROR(codec::CheckArrays(m, specs, /*allow_extra=*/false, &u));
  // The data frame of each spec, by name (CheckArrays made each present once, top-level).
  std::vector<const uint8_t*> at(specs.size(), nullptr);
  for (const Entry& e : m.entries) {
    for (size_t s = 0; s < specs.size(); ++s)
      if (e.depth == 0 && e.name == specs[s].name) at[s] = frames[1 + e.frame].data;
  }
  // Where each sent field's rows are.
  std::vector<const uint8_t*> rows_at(F, nullptr);
  bool any_rows = false;
  size_t next_spec = 8;
  for (int f = 0; f < F; ++f)
    if (layout.sends(f)) {
      rows_at[f] = at[next_spec++];
      any_rows = true;
    }
  if (any_rows && (u < 1 || u > n * w))
    return Error(bad, "stream: expected 1..", n * w, " distinct rows, got ", u);
  std::memcpy(seq, at[0], sizeof(int64_t));
  const int32_t* index = reinterpret_cast<const int32_t*>(at[7]);
  // Every index is checked before any row is read through it.
  if (any_rows) {
    for (int64_t i = 0; i < n * w; ++i) {
      int32_t v;
      std::memcpy(&v, index + i, sizeof(v));
      if (v < 0 || v >= u)
        return Error(bad, "stream: index[", i / w, ", ", i % w, "] = ", v, " outside [0, ", u,
                     ")");
    }
  }
  const int shift = layout.shift();
  for (int f = 0; f < F; ++f) {
    if (!layout.sends(f)) continue;
    const uint8_t* rows = rows_at[f];
    const size_t rb = layout.schema.field(f).bytes();
    for (int side = 0; side < 2; ++side) {
      if (!layout.flags[side * F + f]) continue;
      uint8_t* out = parts[side * F + f];
      const int off = side == 0 ? 0 : shift;
      for (int64_t b = 0; b < n; ++b) {
        for (int j = 0; j < fs; ++j) {
          int32_t v;
          std::memcpy(&v, index + b * w + j + off, sizeof(v));
          std::memcpy(out + (b * fs + j) * rb, rows + static_cast<size_t>(v) * rb, rb);
        }
      }
    }
  }
  std::memcpy(parts[2 * F], at[3], n * sizeof(float));
  std::memcpy(parts[2 * F + 1], at[4], n * sizeof(double));
  std::memcpy(parts[2 * F + 2], at[5], n);
  std::memcpy(parts[2 * F + 3], at[6], n * sizeof(int64_t));
  std::memcpy(parts[2 * F + 4], at[1], sizeof(int64_t));
  std::memcpy(parts[2 * F + 5], at[2], sizeof(double));
  return Status::OK();
}

BatchLayout StreamSlotLayout(const StreamLayout& layout) {
  return MemoryBatchLayout(layout.schema, layout.batch_size, layout.frame_stack,
                           layout.flags.data(), /*totals=*/true);
}

Status EncodeErrorMessage(const std::string& kind, const std::string& reason, std::string* header,
                          std::vector<Frame>* data) {
  codec::Message m;
  m.type = MsgType::kError;
  data->clear();
  for (const auto& [name, text] : {std::pair<const char*, const std::string*>{"error", &kind},
                                   {"reason", &reason}}) {
    Entry e;
    e.name = name;
    e.kind = Kind::kStr;
    e.dtype = DType::kUInt8;
    e.shape = {static_cast<int64_t>(text->size())};
    m.entries.push_back(std::move(e));
    data->push_back({reinterpret_cast<const uint8_t*>(text->data()), text->size()});
  }
  MEMOIRE_RETURN_IF_ERROR(codec::Finalize(&m));
  return codec::EncodeHeader(m, header);
}

bool ReadErrorMessage(const Frame* frames, size_t n_frames, std::string* kind,
                      std::string* reason, int64_t* slot) {
  codec::Message m;
  codec::Limits limits;
  limits.max_payload_bytes = 1 << 20;
  if (!DecodeFrames(frames, n_frames, limits, &m).ok() || m.type != MsgType::kError) return false;
  kind->clear();
  reason->clear();
  if (slot != nullptr) *slot = -1;
  for (const Entry& e : m.entries) {
    // Only a top-level scalar or string has a frame (DecodeFrames checked its size); other
    // kinds (None, containers) have none, so nothing is read before these checks.
    if (e.depth != 0 || e.frame < 0) continue;
    const Frame& f = frames[1 + e.frame];
    if (slot != nullptr && e.name == "slot" && e.kind == Kind::kScalar &&
        e.dtype == DType::kInt64 && f.size == sizeof(int64_t))
      std::memcpy(slot, f.data, sizeof(int64_t));
    if (e.kind != Kind::kStr) continue;
    if (e.name == "error") kind->assign(reinterpret_cast<const char*>(f.data), f.size);
    if (e.name == "reason") reason->assign(reinterpret_cast<const char*>(f.data), f.size);
  }
  return true;
}

}  // namespace memoire
