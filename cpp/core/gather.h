// Batch assembly kernels: copy rows of a column into caller-provided output, in the two stack
// layouts the faces need. Pure functions over raw bytes; thread-safe on disjoint outputs.
//
// `slots` are already ring-reduced row numbers (0 <= slot < capacity); the caller owns the
// ring arithmetic and validity. Cost: O(n * row_bytes), memcpy-bound.
#pragma once

#include <cstddef>
#include <cstdint>

namespace memoire {

// A batch copy of at least this many bytes is split over two threads (the caller's and a
// parked helper, core/helper_thread.h): scattered multi-kilobyte rows are bound by memory
// latency, not bandwidth, so a second thread nearly doubles the copy's throughput.
constexpr size_t kParallelCopyBytes = 512 * 1024;

// out[b] = column[slots[b]] for b < n; rows of `row_bytes` bytes. With n = batch * stack and
// slots[b * stack + k] it writes the contiguous stack layout [batch, stack, *shape].
void GatherRows(const uint8_t* column, size_t row_bytes, const int64_t* slots, int64_t n,
                uint8_t* out);

// Channel-last stack layout [n, *shape, stack] (what Dopamine returns):
// out[b, e, k] = element e of column[slots[b * stack + k]], elements of `elem_bytes` bytes,
// `row_elems` elements per row.
void GatherStackChannelLast(const uint8_t* column, size_t elem_bytes, int64_t row_elems,
                            const int64_t* slots, int64_t n, int stack, uint8_t* out);

}  // namespace memoire
