// Frame codec: the LZ4 block format, written here (no third-party library, so wheels stay
// self-contained). Used to store ReplayMemory's states compressed (core/compressed_rows.h).
//
// Format (LZ4's public block format): a block is a run of sequences. Each sequence is a token
// byte (high nibble: literal count, low nibble: match length - 4; 15 means "more follows" as
// bytes of 255 ended by one below 255), the literals, then a 2-byte little-endian offset
// (1..65535, how far back the match starts in the output) and the match, which may overlap its
// own output (a run). The last sequence has literals only. Compress writes blocks the reference
// LZ4 decoder reads (the last 5 bytes are literals, no match starts in the last 12).
//
// Compress is a greedy hash-table matcher (one candidate per 4-byte hash, skipping faster
// through incompressible data): Atari screens shrink several-fold. Decompress checks every
// read and write against its buffers and refuses anything malformed, so a corrupt block (from
// a checkpoint, or memory damage) is an error, never an out-of-bounds access.
//
// Thread safety: pure functions over caller-owned buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace memoire {
namespace lz4 {

// The most bytes Compress writes for `n` input bytes (incompressible data grows by 1/255).
constexpr size_t CompressBound(size_t n) { return n + n / 255 + 16; }

// Compresses src[0, n) into dst, which holds at least CompressBound(n) bytes; returns the
// bytes written (at least 1: an empty input is one token).
size_t Compress(const uint8_t* src, size_t n, uint8_t* dst);

// Decodes the block src[0, src_size) into exactly dst_size bytes at dst. kDataLoss (naming
// the problem) when the block is malformed: truncated, an offset of 0 or before the start of
// the output, a sequence that would write past dst_size, bytes after its last sequence, or a
// block that decodes to fewer than dst_size bytes. dst may be partly written then.
Status Decompress(const uint8_t* src, size_t src_size, uint8_t* dst, size_t dst_size);

}  // namespace lz4
}  // namespace memoire
