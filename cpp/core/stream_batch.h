// StreamBatch: a ReplayMemory batch as the sampling stream carries it (server side:
// memoire/server/sampling_service.py; learner side: memoire/stream.py). Each distinct stored
// row of the drawn stacks travels once, with an index; the learner stacks the rows back into
// ReplayMemory::Sample's layout, bit for bit.
//
// Windows. Row b of a batch reads `window` entries of one episode: window position k <
// frame_stack is prev[b, k] (the entry frame_stack - 1 - k before the drawn one), position
// k >= frame_stack is next[b, k - shift], with shift = min(multi_step, frame_stack). So
//   prev[b, j] = rows[index[b, j]],  next[b, j] = rows[index[b, j + shift]],
// window = frame_stack + shift. With multi_step < frame_stack the two stacks overlap: an Atari
// batch (stack 4, multi_step 1) carries 5 rows per transition instead of 8, fewer where drawn
// transitions share entries (rows are deduplicated across the whole batch).
//
// Wire: a STREAM_BATCH message (codec framing, core/codec.h) with these top-level entries, in
// this order (n = batch size, U = distinct rows, 1 <= U <= n * window):
//   seq            int64 0-d     the stream's batch number (0, 1, 2, ...)
//   num_sampleable int64 0-d     the memory's counts when drawn (importance weights)
//   total_weight   float64 0-d
//   weight f32[n], prob f64[n], done bool[n], id int64[n]   as ReplayMemory::Sample
//   index          int32[n, window], values in [0, U)
//   rows/<field>   dtype[U, *shape] for each field the stream sends, in field order
// except, on a stream that carries the memory's compressed states (StreamLayout::
// compressed_state, agreed at open), the state field's rows as the memory stores them, LZ4
// blocks (core/frame_codec.h), not decoded:
//   zsizes/s       uint32[U]     each row's block bytes (row_bytes: the row itself, raw)
//   zrows/s        uint8[sum]    the blocks, one after another
// So an Atari screen travels as its ~0.7 KB block instead of its 7 KB, and the server copies
// the blocks instead of decoding them; the learner decodes each distinct row once, checking
// every block as a checkpoint's.
//
// On one host (shared memory) nothing of this travels: the server writes each batch straight
// into a slot of a mapping the learner shares, in the learner's final layout (StreamSlotLayout:
// ReplayMemory::Sample's stacks and small fields, core/batch_layout.h), and the learner hands
// out views of the slot without copying. The batch's notice (its seq and slot) goes through
// the mapping's ring (core/stream_ring.h), not the socket. Which slots the server may write is
// the learner's to say: at open every slot is granted; the learner gives a slot back (a credit
// in the ring) once every array of the batch it held is dropped, in any order. So a slot is
// never written while the learner reads it, and a batch the learner keeps costs the stream one
// slot, not the stream.
//
// Thread safety: functions over caller-owned data; thread-safe on distinct outputs.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/batch_layout.h"
#include "core/codec.h"
#include "core/helper_thread.h"
#include "core/protocol.h"
#include "core/schema.h"
#include "core/status.h"

namespace memoire {

constexpr const char* kStreamRowsPrefix = "rows/";

// What both ends of a stream agree on when it opens.
struct StreamLayout {
  Schema schema;  // the memory's seven fields (s a r p v q i)
  int64_t batch_size = 1;
  int frame_stack = 1;
  int multi_step = 1;
  // Which stacks a batch carries: prev of each field, then next (ReplayMemory cache_flags).
  std::array<uint8_t, 2 * protocol::kNumFields> flags{};
  // The state field's rows travel as the memory's LZ4 blocks (zsizes/s, zrows/s).
  bool compressed_state = false;

  int shift() const { return multi_step < frame_stack ? multi_step : frame_stack; }
  int window() const { return frame_stack + shift(); }
  bool sends(int f) const { return flags[f] || flags[protocol::kNumFields + f]; }
  // kInvalidArgument unless the schema has seven fields and the sizes are >= 1.
  Status Check() const;
};

// std::allocator whose resize leaves new elements default-initialized (uninitialized bytes)
// instead of zero-filling them: the rows of a batch are written whole right after the resize,
// and the zero fill cost as much as that gather (a fresh 1.1 MB per Atari batch).
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible<U>::value) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using RowBytes = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;

// One batch, as drawn by ReplayMemory::SampleDistinct (sized by it).
struct StreamBatch {
  int64_t seq = 0;       // the stream's batch number (set by the sender)
  int64_t n = 0;         // rows of the batch
  int64_t distinct = 0;  // U
  int window = 0;
  std::vector<int32_t> index;  // [n, window]
  std::vector<float> weight;
  std::vector<double> prob;
  std::vector<uint8_t> done;
  std::vector<int64_t> id;
  int64_t num_sampleable = 0;
  double total_weight = 0;
  // Filled by SampleDistinct: rows[f] is [U, *shape_f] for the fields `send` selects
  // (the caller sets send before the call), empty for the others.
  std::array<uint8_t, protocol::kNumFields> send{};
  std::array<RowBytes, protocol::kNumFields> rows;
  // Set by the caller on a memory that compresses its states: rows[state] then holds the
  // rows' stored blocks one after another, and state_sizes[U] their bytes.
  bool compressed_state = false;
  std::vector<uint32_t> state_sizes;
};

// The fields a layout sends (prev or next flag set).
std::array<uint8_t, protocol::kNumFields> StreamSends(const StreamLayout& layout);

// The header frame and data frames (views of `b`, valid while it lives) of the STREAM_BATCH
// message of `b`.
Status EncodeStreamBatch(const StreamBatch& b, const Schema& schema, std::string* header,
                         std::vector<codec::Frame>* data);

// Checks a received STREAM_BATCH (frames[0] its header) against `layout` and stacks it into
// the learner's parts, in memoire.feed's ReplayMemory layout: prev[7], next[7]
// (dtype[n, frame_stack, *shape]; a part whose flag is off is not written), weight f32[n],
// prob f64[n], done bool[n], id int64[n], then num_sampleable int64[1] and total_weight
// f64[1]. *seq gets the batch number. kDataLoss on anything malformed (nothing is trusted:
// sizes, dtypes, index bounds), leaving the parts partly written.
// With `scratch` (the receiving thread's own), a large batch (kParallelCopyBytes,
// core/gather.h) is decoded and stacked half on its helper, half on the calling thread.
struct UnstackScratch {
  HelperThread helper;
  RowBytes rows;  // a compressed state field's rows, decoded
};
Status UnstackStreamBatch(const codec::Frame* frames, size_t n_frames, const StreamLayout& layout,
                          const codec::Limits& limits, uint8_t* const* parts, int64_t* seq,
                          UnstackScratch* scratch = nullptr);

// A shared-memory slot in the learner's final layout: the batch's parts (prev[7], next[7],
// weight, prob, done, id, num_sampleable, total_weight) as core/batch_layout.h places them.
BatchLayout StreamSlotLayout(const StreamLayout& layout);

// The ERROR kind of a failed draw (memoire/server/sampling_service.py DRAW_ERROR): unlike a
// refusal, it spent a credit. The server's hub sends it; the learner's source reads it.
inline constexpr const char* kDrawError = "SampleError";

// The header frame of an ERROR message {"error": kind, "reason": reason} (as
// memoire.server.workers.error_reply writes it) and its two data frames (*data: kind, then
// reason).
Status EncodeErrorMessage(const std::string& kind, const std::string& reason, std::string* header,
                          std::vector<codec::Frame>* data);

// The error kind and reason of an ERROR message (frames[0] its header), and its int64 `slot`
// entry where it has one (-1 when absent); false when
// `frames` is not a well-formed current-version ERROR.
bool ReadErrorMessage(const codec::Frame* frames, size_t n_frames, std::string* kind,
                      std::string* reason, int64_t* slot = nullptr);

}  // namespace memoire
