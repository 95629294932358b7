// Schema: named fields, each a dtype and a shape. One schema drives allocation (Columns),
// input checks (bindings), the wire layout (codec) and output signatures. Immutable value
// type; thread-safe to share once built.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace memoire {

struct Field {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;  // empty for a scalar

  int64_t num_elements() const;
  size_t bytes() const { return static_cast<size_t>(num_elements()) * ItemSize(dtype); }
  // "uint8[84,84]" for messages.
  std::string Describe() const;
  bool operator==(const Field& o) const {
    return name == o.name && dtype == o.dtype && shape == o.shape;
  }
};

class Schema {
 public:
  Schema() = default;
  // Fails on empty or duplicate names, negative dimensions, or more than 2^31 bytes per row.
  static Status Make(std::vector<Field> fields, Schema* out);

  const std::vector<Field>& fields() const { return fields_; }
  size_t size() const { return fields_.size(); }
  const Field& field(size_t i) const { return fields_[i]; }
  // -1 when absent.
  int index(const std::string& name) const;
  // Sum of field bytes: the bytes of one row.
  size_t row_bytes() const;
  bool operator==(const Schema& o) const { return fields_ == o.fields_; }
  bool operator!=(const Schema& o) const { return !(*this == o); }

 private:
  std::vector<Field> fields_;
};

}  // namespace memoire
