#include "core/schema.h"

#include <set>
#include <sstream>

namespace memoire {

int64_t Field::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Field::Describe() const {
  std::ostringstream os;
  os << DTypeName(dtype) << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << "]";
  return os.str();
}

Status Schema::Make(std::vector<Field> fields, Schema* out) {
  std::set<std::string> names;
  for (const Field& f : fields) {
    if (f.name.empty()) return Error(Code::kInvalidArgument, "schema: a field has an empty name");
    if (!names.insert(f.name).second)
      return Error(Code::kInvalidArgument, "schema: duplicate field name '", f.name, "'");
    if (!ValidDType(static_cast<uint8_t>(f.dtype)))
      return Error(Code::kInvalidArgument, "schema: field '", f.name, "' has an invalid dtype");
    if (f.shape.size() > 8)
      return Error(Code::kInvalidArgument, "schema: field '", f.name, "' has more than 8 dimensions");
    double bytes = static_cast<double>(ItemSize(f.dtype));
    for (int64_t d : f.shape) {
      if (d < 0)
        return Error(Code::kInvalidArgument, "schema: field '", f.name,
                     "' has a negative dimension in ", f.Describe());
      bytes *= static_cast<double>(d);
    }
    if (bytes > 2147483647.0)
      return Error(Code::kInvalidArgument, "schema: field '", f.name, "' is over 2 GiB per row");
  }
  out->fields_ = std::move(fields);
  return Status::OK();
}

int Schema::index(const std::string& name) const {
  for (size_t i = 0; i < fields_.size(); ++i)
    if (fields_[i].name == name) return static_cast<int>(i);
  return -1;
}

size_t Schema::row_bytes() const {
  size_t n = 0;
  for (const Field& f : fields_) n += f.bytes();
  return n;
}

}  // namespace memoire
