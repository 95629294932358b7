#include "core/gather.h"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace memoire {

namespace {

// Rows of a few bytes (scalars, small vectors): a fixed-size copy the compiler inlines; a call
// to memcpy per row would cost more than the row.
template <size_t kBytes>
void GatherFixed(const uint8_t* column, const int64_t* slots, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; ++b)
    std::memcpy(out + b * kBytes, column + static_cast<size_t>(slots[b]) * kBytes, kBytes);
}

}  // namespace

void GatherRows(const uint8_t* column, size_t row_bytes, const int64_t* slots, int64_t n,
                uint8_t* out) {
  switch (row_bytes) {
    case 0: return;
    case 1: return GatherFixed<1>(column, slots, n, out);
    case 2: return GatherFixed<2>(column, slots, n, out);
    case 4: return GatherFixed<4>(column, slots, n, out);
    case 8: return GatherFixed<8>(column, slots, n, out);
    case 16: return GatherFixed<16>(column, slots, n, out);
    case 32: return GatherFixed<32>(column, slots, n, out);
    default: break;
  }
  for (int64_t b = 0; b < n; ++b) {
    if (b + 1 < n) {
      // Rows are scattered: start fetching the next one while this one is copied.
      const uint8_t* next = column + static_cast<size_t>(slots[b + 1]) * row_bytes;
      for (size_t off = 0; off < row_bytes && off < 1024; off += 64) __builtin_prefetch(next + off);
    }
    std::memcpy(out + b * row_bytes, column + static_cast<size_t>(slots[b]) * row_bytes,
                row_bytes);
  }
}

namespace {

// Interleaves `stack` rows element by element. Specialised for the common widths so the
// compiler can keep the inner loop in registers and vectorise it.
template <typename T, int kStack>
void InterleaveFixed(const T* const* rows, int64_t row_elems, T* out) {
  for (int64_t e = 0; e < row_elems; ++e) {
    for (int k = 0; k < kStack; ++k) out[e * kStack + k] = rows[k][e];
  }
}

template <typename T>
void Interleave(const T* const* rows, int64_t row_elems, int stack, T* out) {
  switch (stack) {
    case 1: std::memcpy(out, rows[0], row_elems * sizeof(T)); return;
    case 2: InterleaveFixed<T, 2>(rows, row_elems, out); return;
    case 3: InterleaveFixed<T, 3>(rows, row_elems, out); return;
    case 4: InterleaveFixed<T, 4>(rows, row_elems, out); return;
    default:
      for (int64_t e = 0; e < row_elems; ++e)
        for (int k = 0; k < stack; ++k) out[e * stack + k] = rows[k][e];
  }
}

// Byte rows stacked 4 deep (Atari): build each output word from four frames at once.
void InterleaveU8x4(const uint8_t* const* rows, int64_t row_elems, uint8_t* out) {
#if defined(__SSE2__)
  // 16 elements of each frame per step: two unpack rounds give a0 b0 c0 d0 a1 b1 c1 d1 ...
  int64_t e0 = 0;
  for (; e0 + 16 <= row_elems; e0 += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[0] + e0));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[1] + e0));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[2] + e0));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[3] + e0));
    const __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
    const __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
    __m128i* o = reinterpret_cast<__m128i*>(out + 4 * e0);
    _mm_storeu_si128(o + 0, _mm_unpacklo_epi16(ab_lo, cd_lo));
    _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(ab_lo, cd_lo));
    _mm_storeu_si128(o + 2, _mm_unpacklo_epi16(ab_hi, cd_hi));
    _mm_storeu_si128(o + 3, _mm_unpackhi_epi16(ab_hi, cd_hi));
  }
  for (int64_t e = e0; e < row_elems; ++e)
    for (int k = 0; k < 4; ++k) out[4 * e + k] = rows[k][e];
  return;
#endif
  const uint8_t* r0 = rows[0];
  const uint8_t* r1 = rows[1];
  const uint8_t* r2 = rows[2];
  const uint8_t* r3 = rows[3];
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  if (reinterpret_cast<uintptr_t>(out) % alignof(uint32_t) != 0) {
    InterleaveFixed<uint8_t, 4>(rows, row_elems, out);
    return;
  }
  for (int64_t e = 0; e < row_elems; ++e) {
    o[e] = static_cast<uint32_t>(r0[e]) | (static_cast<uint32_t>(r1[e]) << 8) |
           (static_cast<uint32_t>(r2[e]) << 16) | (static_cast<uint32_t>(r3[e]) << 24);
  }
}

}  // namespace

void GatherStackChannelLast(const uint8_t* column, size_t elem_bytes, int64_t row_elems,
                            const int64_t* slots, int64_t n, int stack, uint8_t* out) {
  const size_t row_bytes = elem_bytes * static_cast<size_t>(row_elems);
  const uint8_t* rows[64];
  const bool small = stack <= 64;
  for (int64_t b = 0; b < n; ++b) {
    uint8_t* dst = out + b * row_bytes * stack;
    if (!small) {  // rare: generic element-wise copy
      for (int64_t e = 0; e < row_elems; ++e)
        for (int k = 0; k < stack; ++k)
          std::memcpy(dst + (e * stack + k) * elem_bytes,
                      column + slots[b * stack + k] * row_bytes + e * elem_bytes, elem_bytes);
      continue;
    }
    for (int k = 0; k < stack; ++k) rows[k] = column + slots[b * stack + k] * row_bytes;
    // The typed paths read and write whole elements; an output (or column) that is not
    // aligned to the element size takes the bytewise path instead (a typed access would be UB).
    const bool aligned = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(column) |
                           row_bytes) % elem_bytes) == 0;
    switch (aligned ? elem_bytes : 0) {
      case 1:
        if (stack == 4) InterleaveU8x4(rows, row_elems, dst);
        else Interleave(rows, row_elems, stack, dst);
        break;
      case 2:
        Interleave(reinterpret_cast<const uint16_t* const*>(rows), row_elems, stack,
                   reinterpret_cast<uint16_t*>(dst));
        break;
      case 4:
        Interleave(reinterpret_cast<const uint32_t* const*>(rows), row_elems, stack,
                   reinterpret_cast<uint32_t*>(dst));
        break;
      case 8:
        Interleave(reinterpret_cast<const uint64_t* const*>(rows), row_elems, stack,
                   reinterpret_cast<uint64_t*>(dst));
        break;
      default:
        for (int64_t e = 0; e < row_elems; ++e)
          for (int k = 0; k < stack; ++k)
            std::memcpy(dst + (e * stack + k) * elem_bytes, rows[k] + e * elem_bytes, elem_bytes);
    }
  }
}

}  // namespace memoire
