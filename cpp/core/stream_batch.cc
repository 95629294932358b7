#include "core/stream_batch.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "core/frame_codec.h"
#include "core/gather.h"
#include "core/replay_memory.h"

namespace memoire {

using codec::Entry;
using codec::Frame;
using codec::Kind;
using codec::MsgType;

// A compressed state field's entries (core/stream_batch.h).
constexpr const char* kZSizes = "zsizes/s";
constexpr const char* kZRows = "zrows/s";

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
    if (f == kState && out->compressed_state) {
      if (!states_)
        return Error(Code::kFailedPrecondition, "sample: compressed rows asked of a memory "
                     "that does not compress its states");
      out->state_sizes.resize(u);
      size_t total = 0;
      MEMOIRE_RETURN_IF_ERROR(states_->BlockSizes(uniq.data(), u, out->state_sizes.data(), &total));
      out->rows[f].resize(total);
      states_->CopyBlocks(uniq.data(), u, out->rows[f].data());
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
    if (f == protocol::kStateField && b.compressed_state) {
      add(Array(kZSizes, DType::kUInt32, {b.distinct}), b.state_sizes.data(),
          b.state_sizes.size() * sizeof(uint32_t));
      add(Array(kZRows, DType::kUInt8, {static_cast<int64_t>(b.rows[f].size())}),
          b.rows[f].data(), b.rows[f].size());
      continue;
    }
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

// Bytes of one stack entry of a transition in every stack the layout carries.
size_t EntryBytes(const StreamLayout& layout) {
  constexpr int F = protocol::kNumFields;
  size_t bytes = 0;
  for (int f = 0; f < F; ++f)
    bytes += ((layout.flags[f] != 0) + (layout.flags[F + f] != 0)) * layout.schema.field(f).bytes();
  return bytes;
}

}  // namespace

Status UnstackStreamBatch(const Frame* frames, size_t n_frames, const StreamLayout& layout,
                          const codec::Limits& limits, uint8_t* const* parts, int64_t* seq,
                          UnstackScratch* scratch) {
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
  constexpr int kState = protocol::kStateField;
  const bool compressed = layout.compressed_state && layout.sends(kState);
  // The compressed blocks' total bytes: a second free dimension, read first.
  int64_t zbytes = 0;
  if (compressed)
    MEMOIRE_RETURN_IF_ERROR(codec::CheckArrays(m, {{kZRows, DType::kUInt8, {-1}}},
                                               /*allow_extra=*/true, &zbytes));
  std::vector<codec::ArraySpec> specs = {
      {"seq", DType::kInt64, {}},          {"num_sampleable", DType::kInt64, {}},
      {"total_weight", DType::kFloat64, {}}, {"weight", DType::kFloat32, {n}},
      {"prob", DType::kFloat64, {n}},      {"done", DType::kBool, {n}},
      {"id", DType::kInt64, {n}},          {"index", DType::kInt32, {n, w}}};
  for (int f = 0; f < F; ++f) {
    if (!layout.sends(f)) continue;
    if (f == kState && compressed) {
      specs.push_back({kZSizes, DType::kUInt32, {-1}});  // one per distinct row: U
      specs.push_back({kZRows, DType::kUInt8, {zbytes}});
      continue;
    }
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
  // Where each sent field's rows are (a compressed state field's: its sizes, then blocks).
  std::vector<const uint8_t*> rows_at(F, nullptr);
  const uint8_t* zsizes = nullptr;
  const uint8_t* zrows = nullptr;
  bool any_rows = false;
  size_t next_spec = 8;
  for (int f = 0; f < F; ++f)
    if (layout.sends(f)) {
      if (f == kState && compressed) {
        zsizes = at[next_spec++];
        zrows = at[next_spec++];
      } else {
        rows_at[f] = at[next_spec++];
      }
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
  // A compressed state field: each block's bounds checked, then the rows decoded (each block
  // checked by the decoder) into the scratch rows, half on the helper for a large batch.
  // Without a caller's scratch, a compressed state field's rows are decoded here, into rows
  // that must outlive the stacking below (they are read there, not only in the decode block).
  RowBytes local_rows;
  const bool split = scratch != nullptr && n >= 2 &&
                     EntryBytes(layout) * static_cast<size_t>(n) * fs >= kParallelCopyBytes;
  if (compressed) {
    const size_t rb = layout.schema.field(kState).bytes();
    std::vector<uint64_t> start(static_cast<size_t>(u) + 1, 0);
    for (int64_t k = 0; k < u; ++k) {
      uint32_t size;
      std::memcpy(&size, zsizes + k * sizeof(uint32_t), sizeof(size));
      if (size == 0 || size > rb)
        return Error(bad, "stream: compressed row ", k, " of ", size, " bytes, expected 1..", rb);
      start[k + 1] = start[k] + size;
    }
    if (start[u] != static_cast<uint64_t>(zbytes))
      return Error(bad, "stream: compressed rows of ", start[u], " bytes in all, the message "
                   "has ", zbytes);
    RowBytes& rows = scratch != nullptr ? scratch->rows : local_rows;
    rows.resize(static_cast<size_t>(u) * rb);
    auto decode = [&](int64_t k0, int64_t k1, Status* status) {
      for (int64_t k = k0; k < k1 && status->ok(); ++k) {
        const size_t size = start[k + 1] - start[k];
        uint8_t* dst = rows.data() + static_cast<size_t>(k) * rb;
        if (size == rb)
          std::memcpy(dst, zrows + start[k], rb);  // stored raw
        else
          *status = lz4::Decompress(zrows + start[k], size, dst, rb);
      }
    };
    Status status, helper_status;
    int64_t half = u;
    if (split && scratch->helper.Start([&] { decode(u / 2, u, &helper_status); })) half = u / 2;
    decode(0, half, &status);
    if (half < u) scratch->helper.Wait();
    const Status& failed = status.ok() ? helper_status : status;
    if (!failed.ok()) return Error(bad, "stream: a compressed row: ", failed.message());
    rows_at[kState] = rows.data();
  }
  const int shift = layout.shift();
  // Stacks transitions [b0, b1) of every stack the layout carries.
  auto stack = [&](int64_t b0, int64_t b1) {
    for (int f = 0; f < F; ++f) {
      if (!layout.sends(f)) continue;
      const uint8_t* rows = rows_at[f];
      const size_t rb = layout.schema.field(f).bytes();
      for (int side = 0; side < 2; ++side) {
        if (!layout.flags[side * F + f]) continue;
        uint8_t* out = parts[side * F + f];
        const int off = side == 0 ? 0 : shift;
        for (int64_t b = b0; b < b1; ++b) {
          for (int j = 0; j < fs; ++j) {
            int32_t v;
            std::memcpy(&v, index + b * w + j + off, sizeof(v));
            std::memcpy(out + (b * fs + j) * rb, rows + static_cast<size_t>(v) * rb, rb);
          }
        }
      }
    }
  };
  int64_t half = n;
  if (split && scratch->helper.Start([&] { stack(n / 2, n); }))
    half = n / 2;  // else no thread to be had: everything here
  stack(0, half);
  if (half < n) scratch->helper.Wait();
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
  // Every batch a learner receives comes through here first: its header's type is peeked at,
  // so a batch is not decoded twice, nor refused (with an error message built for nothing)
  // by the 1 MiB limit meant for an ERROR's reason.
  if (n_frames < 1 || frames == nullptr || !codec::IsCurrent(frames[0], MsgType::kError))
    return false;
  codec::Message m;
  codec::Limits limits;
  limits.max_payload_bytes = 1 << 20;
  if (!DecodeFrames(frames, n_frames, limits, &m).ok()) return false;
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
