// Columns: struct-of-arrays storage for `capacity` rows of a Schema. Each field is one
// 64-byte-aligned block, so one field of many rows is contiguous. Rows are addressed by slot
// (0 <= slot < capacity); ring arithmetic is the owner's. Thread-compatible.
//
// Memory. Blocks are reserved, not committed: on Linux each is a private anonymous mapping
// that reads as zeros and takes physical pages only where rows are written, so resident memory
// follows what is stored, not the capacity (a 1,000,000-slot Atari ring costs nothing until
// frames arrive). Nothing here touches a page it does not write.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
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
    for (const Field& f : schema.fields())
      blocks_.push_back(Block::Allocate(f.bytes() * static_cast<size_t>(capacity)));
  }
  Columns(Columns&& o) noexcept
      : schema_(std::move(o.schema_)), capacity_(o.capacity_), blocks_(std::move(o.blocks_)) {
    o.blocks_.clear();
  }
  Columns& operator=(Columns&& o) noexcept {
    if (this != &o) {
      Release();
      schema_ = std::move(o.schema_);
      capacity_ = o.capacity_;
      blocks_ = std::move(o.blocks_);
      o.blocks_.clear();
    }
    return *this;
  }
  Columns(const Columns&) = delete;
  Columns& operator=(const Columns&) = delete;
  ~Columns() { Release(); }

  // False when an allocation failed (the caller reports kResourceExhausted).
  bool allocated() const {
    for (const auto& b : blocks_)
      if (!b.data) return false;
    return true;
  }
  const Schema& schema() const { return schema_; }
  int64_t capacity() const { return capacity_; }
  size_t row_bytes(int field) const { return schema_.field(field).bytes(); }
  uint8_t* data(int field) { return blocks_[field].data; }
  const uint8_t* data(int field) const { return blocks_[field].data; }
  uint8_t* row(int field, int64_t slot) { return data(field) + row_bytes(field) * slot; }
  const uint8_t* row(int field, int64_t slot) const { return data(field) + row_bytes(field) * slot; }
  void Write(int field, int64_t slot, const void* src) {
    std::memcpy(row(field, slot), src, row_bytes(field));
  }
  void Zero(int field, int64_t slot) { std::memset(row(field, slot), 0, row_bytes(field)); }
  // Bytes reserved by the blocks (resident memory is only what was written).
  size_t allocated_bytes() const { return schema_.row_bytes() * static_cast<size_t>(capacity_); }

  // Makes this storage hold `other`'s contents (same schema and capacity) and leaves `other`
  // reading as zeros. On Linux the pages move (mremap): no copy, no second resident copy, and
  // pointers into this storage stay valid. Elsewhere the bytes are copied.
  void TakeContents(Columns& other) {
    for (size_t f = 0; f < blocks_.size(); ++f) blocks_[f].TakeContents(other.blocks_[f]);
  }

 private:
  struct Block {
    uint8_t* data = nullptr;  // first byte of the field
    size_t bytes = 0;         // the field's bytes (capacity rows)
    size_t mapped = 0;        // bytes mapped at `data` (0: from calloc)

    // Large blocks are 2 MiB aligned and asked to use transparent huge pages: sampling reads
    // rows at random across the whole block, and with 4 KiB pages every row costs TLB misses.
    static Block Allocate(size_t bytes) {
      Block b;
      b.bytes = bytes;
#if defined(__linux__)
      constexpr size_t kHuge = size_t{2} << 20;
      const bool large = bytes >= 4 * kHuge;
      const size_t align = large ? kHuge : 4096;
      const size_t size = ((bytes ? bytes : 1) + align - 1) / align * align;
      // Reserve size + align, then trim both ends to an aligned `size`. MAP_NORESERVE: the
      // capacity is address space, not a commitment.
      const size_t span = size + (large ? align : 0);
      void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) return b;
      uintptr_t start = reinterpret_cast<uintptr_t>(p);
      const uintptr_t aligned = (start + align - 1) / align * align;
      if (aligned > start) munmap(p, aligned - start);
      const uintptr_t end = aligned + size, span_end = start + span;
      if (span_end > end) munmap(reinterpret_cast<void*>(end), span_end - end);
#if defined(MADV_HUGEPAGE)
      if (large) madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
#endif
      b.data = reinterpret_cast<uint8_t*>(aligned);
      b.mapped = size;
#else
      // calloc of a large block gets fresh zero pages from the OS without touching them.
      b.data = static_cast<uint8_t*>(std::calloc(bytes ? bytes : 1, 1));
#endif
      return b;
    }

    void Free() {
#if defined(__linux__)
      if (data && mapped) munmap(data, mapped);
#endif
      if (data && !mapped) std::free(data);
      data = nullptr;
    }

    void TakeContents(Block& src) {
#if defined(__linux__)
      if (data && src.data && mapped && mapped == src.mapped) {
        // Moves src's pages over ours (ours are unmapped by the kernel), then maps fresh zero
        // pages where src was, so both addresses stay valid.
        void* moved = mremap(src.data, src.mapped, mapped, MREMAP_MAYMOVE | MREMAP_FIXED, data);
        if (moved != MAP_FAILED) {
          void* fresh = mmap(src.data, src.mapped, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
          if (fresh == MAP_FAILED) {  // the address is lost: the block is forgotten
            src.data = nullptr;
            src.mapped = 0;
          }
          return;
        }
      }
#endif
      if (!src.data) {
        std::memset(data, 0, bytes);
        return;
      }
      std::memcpy(data, src.data, bytes);
      std::memset(src.data, 0, src.bytes);
    }
  };

  void Release() {
    for (auto& b : blocks_) b.Free();
    blocks_.clear();
  }

  Schema schema_;
  int64_t capacity_ = 0;
  std::vector<Block> blocks_;
};

}  // namespace memoire
