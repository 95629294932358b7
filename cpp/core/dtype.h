// Element types the core stores. A DType is a tag plus an item size; the core moves bytes and
// only interprets float32/float64 (returns, priorities) and bool/uint8 (flags).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace memoire {

enum class DType : uint8_t {
  kBool = 0, kInt8, kUInt8, kInt16, kUInt16, kInt32, kUInt32, kInt64, kUInt64,
  kFloat16, kFloat32, kFloat64,
};
constexpr int kNumDTypes = 12;

inline size_t ItemSize(DType t) {
  switch (t) {
    case DType::kBool: case DType::kInt8: case DType::kUInt8: return 1;
    case DType::kInt16: case DType::kUInt16: case DType::kFloat16: return 2;
    case DType::kInt32: case DType::kUInt32: case DType::kFloat32: return 4;
    case DType::kInt64: case DType::kUInt64: case DType::kFloat64: return 8;
  }
  return 0;
}

// numpy's name for the type ("uint8", "float32", ...), used in messages and the wire format.
inline const char* DTypeName(DType t) {
  static const char* kNames[kNumDTypes] = {"bool",   "int8",   "uint8",   "int16",
                                           "uint16", "int32",  "uint32",  "int64",
                                           "uint64", "float16", "float32", "float64"};
  int i = static_cast<int>(t);
  return (i >= 0 && i < kNumDTypes) ? kNames[i] : "invalid";
}

inline bool DTypeFromName(const std::string& name, DType* out) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (name == DTypeName(static_cast<DType>(i))) {
      *out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

inline bool ValidDType(uint8_t code) { return code < kNumDTypes; }

// A T read from bytes at any alignment (received frames, packed rows).
template <typename T>
inline T LoadUnaligned(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Index of the first NaN or infinity among `count` values of `dtype` at p (any alignment), or
// -1; always -1 for a dtype that is not float32/float64. Sets *value to that element. The scan
// tests exponent bits (all ones: NaN or infinity) with integer ops, which vectorise.
inline int64_t FirstNonFinite(DType dtype, const uint8_t* p, int64_t count, double* value) {
  // (bits & exponent mask) + one exponent ulp carries into the top bit only when the exponent
  // is all ones; OR-ing those sums over the array tells whether any value is non-finite.
  bool bad = false;
  if (dtype == DType::kFloat32) {
    uint32_t acc = 0;
    for (int64_t j = 0; j < count; ++j)
      acc |= (LoadUnaligned<uint32_t>(p + 4 * j) & 0x7f800000u) + 0x00800000u;
    bad = acc >> 31;
  } else if (dtype == DType::kFloat64) {
    uint64_t acc = 0;
    for (int64_t j = 0; j < count; ++j)
      acc |= (LoadUnaligned<uint64_t>(p + 8 * j) & 0x7ff0000000000000ull) + 0x0010000000000000ull;
    bad = acc >> 63;
  }
  if (!bad) return -1;
  for (int64_t j = 0; j < count; ++j) {  // rare: find which one
    const double x = dtype == DType::kFloat32 ? LoadUnaligned<float>(p + 4 * j)
                                              : LoadUnaligned<double>(p + 8 * j);
    if (!std::isfinite(x)) return *value = x, j;
  }
  return -1;
}

}  // namespace memoire
