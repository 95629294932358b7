// Columns: struct-of-arrays storage for `capacity` rows of a Schema. Each field is one
// aligned block, so one field of many rows is contiguous. Rows are addressed by slot
// (0 <= slot < capacity); ring arithmetic is the owner's. Thread-compatible.
//
// Memory: blocks are ReservedBytes (see reserved.h): they read as zeros and take resident
// memory only where rows are written, so a 1,000,000-slot Atari ring costs nothing until
// frames arrive.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/reserved.h"
#include "core/schema.h"

namespace memoire {

class Columns {
 public:
  Columns() = default;
  Columns(const Schema& schema, int64_t capacity) : schema_(schema), capacity_(capacity) {
    for (const Field& f : schema.fields())
      blocks_.emplace_back(f.bytes() * static_cast<size_t>(capacity));
  }

  // False when an allocation failed (the caller reports kResourceExhausted).
  bool allocated() const {
    for (const auto& b : blocks_)
      if (!b.data()) return false;
    return true;
  }
  const Schema& schema() const { return schema_; }
  int64_t capacity() const { return capacity_; }
  size_t row_bytes(int field) const { return schema_.field(field).bytes(); }
  uint8_t* data(int field) { return blocks_[field].data(); }
  const uint8_t* data(int field) const { return blocks_[field].data(); }
  uint8_t* row(int field, int64_t slot) { return data(field) + row_bytes(field) * slot; }
  const uint8_t* row(int field, int64_t slot) const { return data(field) + row_bytes(field) * slot; }
  void Write(int field, int64_t slot, const void* src) {
    std::memcpy(row(field, slot), src, row_bytes(field));
  }
  void Zero(int field, int64_t slot) { std::memset(row(field, slot), 0, row_bytes(field)); }
  // Bytes reserved by the blocks (resident memory is only what was written).
  size_t allocated_bytes() const { return schema_.row_bytes() * static_cast<size_t>(capacity_); }

  // Makes this storage hold `other`'s contents (same schema and capacity) and leaves `other`
  // reading zeros; pages move without a copy where the OS allows (ReservedBytes::TakeContents),
  // and pointers into both stay valid.
  void TakeContents(Columns& other) {
    for (size_t f = 0; f < blocks_.size(); ++f) blocks_[f].TakeContents(other.blocks_[f]);
  }

 private:
  Schema schema_;
  int64_t capacity_ = 0;
  std::vector<ReservedBytes> blocks_;
};

}  // namespace memoire
