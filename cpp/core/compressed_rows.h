// CompressedRows: one field of a ring of `capacity` slots, each row stored LZ4-compressed
// (core/frame_codec.h) in its own heap block. ReplayMemory stores its states here when built
// with compress_states.
//
// Why a block per slot rather than a byte arena that follows the ring: ReplayMemory frees rows
// out of the ring's FIFO order too (a discarded open episode gives its positions back, and
// they are written again), and rows compress to different sizes, so an arena would need its
// own allocator, compaction and rollback. malloc already is that allocator; a block per row
// costs its 8-16 bytes of header, which is small next to a compressed Atari screen (~1 KB),
// and memory follows what is stored: a row's block is freed when it is evicted or replaced.
//
// A row that does not compress (its block would be as large as the raw row) is stored raw:
// a blob of exactly row_bytes bytes is the row itself, any shorter blob is an LZ4 block. Such
// rows cost no decoding. Rows are encoded (Encode) outside the owner's lock: a sampler keeps
// sampling while an adder compresses.
//
// Per slot: a pointer and a size (reserved arrays, resident only where slots were used).
// Thread safety: thread-compatible (the owner's lock guards Put/Clear against Decode);
// Encode is a static pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/reserved.h"
#include "core/status.h"

namespace memoire {

class CompressedRows {
 public:
  // A row's encoded bytes, not yet in a slot.
  struct Blob {
    std::unique_ptr<uint8_t[]> data;
    uint32_t size = 0;
  };
  CompressedRows(int64_t capacity, size_t row_bytes);
  ~CompressedRows();
  CompressedRows(const CompressedRows&) = delete;
  CompressedRows& operator=(const CompressedRows&) = delete;

  bool allocated() const { return ptr_.allocated() && size_.allocated(); }
  size_t row_bytes() const { return row_bytes_; }

  // Encodes n rows of row_bytes bytes each (src[k * row_bytes ...]); a null src encodes rows
  // of zeros. Allocates; touches no slot.
  static std::vector<Blob> Encode(const uint8_t* src, int64_t n, size_t row_bytes);

  // Stores `blob` in `slot`, freeing the row it held.
  void Put(int64_t slot, Blob blob);
  // Frees the row of `slot` (nothing stored there afterwards).
  void Clear(int64_t slot);
  // Decodes the row of each of slots[0, n) into out[k * row_bytes ...]. kDataLoss when a
  // slot holds nothing or a block fails to decode (a bug or memory damage: rows stored here
  // were encoded here).
  Status Decode(const int64_t* slots, int64_t n, uint8_t* out) const;
  // The stored blocks of slots[0, n) as they are (a sampling stream sends them so, and the
  // learner decodes: core/stream_batch.h): sizes[k] gets each block's bytes (row_bytes for a
  // row stored raw) and their sum goes to *total. kDataLoss when a slot holds nothing.
  Status BlockSizes(const int64_t* slots, int64_t n, uint32_t* sizes, size_t* total) const;
  // Copies those blocks, one after another, to out (BlockSizes' total bytes).
  void CopyBlocks(const int64_t* slots, int64_t n, uint8_t* out) const;

  // Encoded bytes held (the blobs' payloads, without the allocator's headers).
  size_t stored_bytes() const { return stored_bytes_; }
  // Reserved bytes of the per-slot index (resident only where slots were used).
  size_t index_bytes() const { return ptr_.size() * (sizeof(uint8_t*) + sizeof(uint32_t)); }
  void swap(CompressedRows& o) noexcept;

 private:
  size_t row_bytes_;
  ReservedArray<uint8_t*> ptr_;  // per slot: its blob (owned), null when none
  ReservedArray<uint32_t> size_;  // per slot: its blob's bytes (rows fit: Schema caps them at 2**31)
  size_t stored_bytes_ = 0;
};

}  // namespace memoire
