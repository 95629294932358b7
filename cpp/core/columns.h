// Columns: struct-of-arrays storage for `capacity` rows of a Schema. Each field is one
// 64-byte-aligned block, so one field of many rows is contiguous. Rows are addressed by slot
// (0 <= slot < capacity); ring arithmetic is the owner's. Thread-compatible.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/schema.h"

namespace memoire {

class Columns {
 public:
  Columns() = default;
  Columns(const Schema& schema, int64_t capacity) : schema_(schema), capacity_(capacity) {
    for (const Field& f : schema.fields()) {
      const size_t bytes = f.bytes() * static_cast<size_t>(capacity);
      blocks_.emplace_back(static_cast<uint8_t*>(Allocate(bytes)));
    }
  }

  // False when an allocation failed (the caller reports kResourceExhausted).
  bool allocated() const {
    for (const auto& b : blocks_)
      if (!b) return false;
    return true;
  }
  const Schema& schema() const { return schema_; }
  int64_t capacity() const { return capacity_; }
  size_t row_bytes(int field) const { return schema_.field(field).bytes(); }
  uint8_t* data(int field) { return blocks_[field].get(); }
  const uint8_t* data(int field) const { return blocks_[field].get(); }
  uint8_t* row(int field, int64_t slot) { return data(field) + row_bytes(field) * slot; }
  const uint8_t* row(int field, int64_t slot) const { return data(field) + row_bytes(field) * slot; }
  void Write(int field, int64_t slot, const void* src) {
    std::memcpy(row(field, slot), src, row_bytes(field));
  }
  void Zero(int field, int64_t slot) { std::memset(row(field, slot), 0, row_bytes(field)); }
  // Bytes held by the blocks.
  size_t allocated_bytes() const { return schema_.row_bytes() * static_cast<size_t>(capacity_); }

 private:
  // Large blocks are 2 MiB aligned and asked to use transparent huge pages: sampling reads rows
  // at random across the whole block, and with 4 KiB pages every row costs TLB misses.
  static void* Allocate(size_t bytes) {
    constexpr size_t kHuge = 2u << 20;
    const bool large = bytes >= 4 * kHuge;
    const size_t align = large ? kHuge : 64;
    const size_t size = large ? (bytes + kHuge - 1) / kHuge * kHuge : (bytes ? bytes : 64);
    void* p = nullptr;
    if (posix_memalign(&p, align, size) != 0) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (large) madvise(p, size, MADV_HUGEPAGE);
#endif
    std::memset(p, 0, size);  // a fresh memory reads as zeros
    return p;
  }

  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  Schema schema_;
  int64_t capacity_ = 0;
  std::vector<std::unique_ptr<uint8_t, Free>> blocks_;
};

}  // namespace memoire
