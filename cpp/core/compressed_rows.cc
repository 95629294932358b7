#include "core/compressed_rows.h"

#include <cstring>
#include <utility>

#include "core/frame_codec.h"

namespace memoire {

CompressedRows::CompressedRows(int64_t capacity, size_t row_bytes)
    : row_bytes_(row_bytes),
      ptr_(static_cast<size_t>(capacity)),
      size_(static_cast<size_t>(capacity)) {}

CompressedRows::~CompressedRows() {
  if (!ptr_.allocated()) return;
  for (size_t s = 0; s < ptr_.size(); ++s) delete[] ptr_[s];
}

std::vector<CompressedRows::Blob> CompressedRows::Encode(const uint8_t* src, int64_t n,
                                                         size_t row_bytes) {
  std::vector<Blob> out(static_cast<size_t>(n));
  std::vector<uint8_t> scratch(lz4::CompressBound(row_bytes));
  std::vector<uint8_t> zeros(src == nullptr ? row_bytes : 0);
  for (int64_t k = 0; k < n; ++k) {
    const uint8_t* row = src ? src + static_cast<size_t>(k) * row_bytes : zeros.data();
    size_t size = lz4::Compress(row, row_bytes, scratch.data());
    const uint8_t* bytes = scratch.data();
    if (size >= row_bytes) {  // does not compress: keep the row itself
      size = row_bytes;
      bytes = row;
    }
    Blob& b = out[static_cast<size_t>(k)];
    b.size = static_cast<uint32_t>(size);
    b.data.reset(new uint8_t[size > 0 ? size : 1]);
    if (size > 0) std::memcpy(b.data.get(), bytes, size);
  }
  return out;
}

void CompressedRows::Put(int64_t slot, Blob blob) {
  Clear(slot);
  stored_bytes_ += blob.size;
  size_[slot] = blob.size;
  ptr_[slot] = blob.data.release();
}

void CompressedRows::Clear(int64_t slot) {
  stored_bytes_ -= size_[slot];
  delete[] ptr_[slot];
  ptr_[slot] = nullptr;
  size_[slot] = 0;
}

Status CompressedRows::Decode(const int64_t* slots, int64_t n, uint8_t* out) const {
  if (row_bytes_ == 0) return Status::OK();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t slot = slots[k];
    const uint8_t* blob = ptr_[slot];
    uint8_t* dst = out + static_cast<size_t>(k) * row_bytes_;
    if (size_[slot] == row_bytes_) {
      std::memcpy(dst, blob, row_bytes_);  // stored raw
      continue;
    }
    if (blob == nullptr)
      return Error(Code::kDataLoss, "compressed rows: slot ", slot, " holds no row");
    MEMOIRE_RETURN_IF_ERROR(lz4::Decompress(blob, size_[slot], dst, row_bytes_));
  }
  return Status::OK();
}

Status CompressedRows::BlockSizes(const int64_t* slots, int64_t n, uint32_t* sizes,
                                  size_t* total) const {
  *total = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (ptr_[slots[k]] == nullptr && row_bytes_ > 0)
      return Error(Code::kDataLoss, "compressed rows: slot ", slots[k], " holds no row");
    sizes[k] = size_[slots[k]];
    *total += sizes[k];
  }
  return Status::OK();
}

void CompressedRows::CopyBlocks(const int64_t* slots, int64_t n, uint8_t* out) const {
  for (int64_t k = 0; k < n; ++k) {
    const uint32_t size = size_[slots[k]];
    if (size > 0) std::memcpy(out, ptr_[slots[k]], size);
    out += size;
  }
}

void CompressedRows::swap(CompressedRows& o) noexcept {
  std::swap(row_bytes_, o.row_bytes_);
  ptr_.swap(o.ptr_);
  size_.swap(o.size_);
  std::swap(stored_bytes_, o.stored_bytes_);
}

}  // namespace memoire
