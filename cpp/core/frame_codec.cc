#include "core/frame_codec.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace memoire {
namespace lz4 {
namespace {

constexpr size_t kMinMatch = 4;
constexpr size_t kLastLiterals = 5;  // the block's last bytes are always literals
constexpr size_t kMatchFindLimit = 12;  // no match starts in the block's last 12 bytes
constexpr size_t kMaxOffset = 65535;
constexpr int kSkipTrigger = 6;  // after 2**6 misses in a row the search step grows by one

inline uint32_t Read32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint64_t Read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline uint32_t Hash(uint32_t v, int log) { return (v * 2654435761u) >> (32 - log); }

// The length of the common prefix of a[0..) and b[0..), stopping at a_limit (a < a_limit).
inline size_t CommonLength(const uint8_t* a, const uint8_t* b, const uint8_t* a_limit) {
  const uint8_t* start = a;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  while (a + 8 <= a_limit) {
    const uint64_t diff = Read64(a) ^ Read64(b);
    if (diff != 0) return static_cast<size_t>(a - start) + __builtin_ctzll(diff) / 8;
    a += 8;
    b += 8;
  }
#endif
  while (a < a_limit && *a == *b) {
    ++a;
    ++b;
  }
  return static_cast<size_t>(a - start);
}

// A length's continuation bytes (its part at or above 15): 255s, then the rest.
inline uint8_t* PutLength(uint8_t* op, size_t rest) {
  for (; rest >= 255; rest -= 255) *op++ = 255;
  *op++ = static_cast<uint8_t>(rest);
  return op;
}

// One sequence: the literals [lit, lit + n_lit), then (when match_len > 0) the match.
inline uint8_t* PutSequence(uint8_t* op, const uint8_t* lit, size_t n_lit, size_t offset,
                            size_t match_len) {
  uint8_t* token = op++;
  const size_t ml = match_len > 0 ? match_len - kMinMatch : 0;
  *token = static_cast<uint8_t>((std::min<size_t>(n_lit, 15) << 4) | std::min<size_t>(ml, 15));
  if (n_lit >= 15) op = PutLength(op, n_lit - 15);
  if (n_lit > 0) std::memcpy(op, lit, n_lit);  // (an empty input may have no address)
  op += n_lit;
  if (match_len == 0) return op;
  *op++ = static_cast<uint8_t>(offset);
  *op++ = static_cast<uint8_t>(offset >> 8);
  if (ml >= 15) op = PutLength(op, ml - 15);
  return op;
}

}  // namespace

size_t Compress(const uint8_t* src, size_t n, uint8_t* dst) {
  uint8_t* op = dst;
  size_t anchor = 0;  // the first byte not yet written
  if (n >= kMatchFindLimit + 1) {
    // A table sized to the input: zeroing a large one would cost more than a small frame's
    // whole compression. Entries are positions; 0 (unset) is a valid, checked candidate too.
    int log = 8;
    while (log < 14 && (size_t{1} << log) < n) ++log;
    std::vector<uint32_t> table(size_t{1} << log, 0);
    const size_t match_limit = n - kLastLiterals;  // a match ends at or before this
    const size_t last_start = n - kMatchFindLimit;  // and starts at or before this
    size_t ip = 1;
    unsigned misses = 0;
    while (ip <= last_start) {
      const uint32_t h = Hash(Read32(src + ip), log);
      size_t ref = table[h];
      table[h] = static_cast<uint32_t>(ip);
      if (ip - ref > kMaxOffset || Read32(src + ref) != Read32(src + ip)) {
        ip += 1 + (misses++ >> kSkipTrigger);
        continue;
      }
      misses = 0;
      // Extend backwards over the pending literals, then forwards.
      while (ip > anchor && ref > 0 && src[ip - 1] == src[ref - 1]) {
        --ip;
        --ref;
      }
      const size_t len = kMinMatch + CommonLength(src + ip + kMinMatch, src + ref + kMinMatch,
                                                  src + match_limit);
      op = PutSequence(op, src + anchor, ip - anchor, ip - ref, len);
      ip += len;
      anchor = ip;
      if (ip > last_start) break;
      table[Hash(Read32(src + ip - 2), log)] = static_cast<uint32_t>(ip - 2);
    }
  }
  return static_cast<size_t>(PutSequence(op, src + anchor, n - anchor, 0, 0) - dst);
}

Status Decompress(const uint8_t* src, size_t src_size, uint8_t* dst, size_t dst_size) {
  const Code bad = Code::kDataLoss;
  const uint8_t* ip = src;
  const uint8_t* const iend = src + src_size;
  uint8_t* op = dst;
  uint8_t* const oend = dst + dst_size;
  // The continuation bytes of a length; false when the block ends inside them.
  auto read_length = [&](size_t* len) {
    uint8_t b;
    do {
      if (ip == iend) return false;
      b = *ip++;
      *len += b;
    } while (b == 255);
    return true;
  };
  for (;;) {
    if (ip == iend)
      return Error(bad, "lz4: the block ends without its last literals (", src_size, " bytes)");
    const uint8_t token = *ip++;
    size_t lit = token >> 4;
    if (lit < 15 && iend - ip >= 16 && oend - op >= 16) {
      // Fast path (most sequences): a short literal run with 16 bytes of room on both sides
      // is one fixed-size copy; the bytes past `lit` are written over by what follows.
      std::memcpy(op, ip, 16);
    } else {
      if (lit == 15 && !read_length(&lit))
        return Error(bad, "lz4: the block ends inside a literal length");
      if (lit > static_cast<size_t>(iend - ip))
        return Error(bad, "lz4: ", lit, " literals at byte ", ip - src, " run past the block's ",
                     src_size, " bytes");
      if (lit > static_cast<size_t>(oend - op))
        return Error(bad, "lz4: ", lit, " literals would write past the ", dst_size,
                     " bytes expected");
      if (lit > 0) std::memcpy(op, ip, lit);
    }
    op += lit;
    ip += lit;
    if (ip == iend) break;  // the last sequence: literals only
    if (iend - ip < 2) return Error(bad, "lz4: the block ends inside a match offset");
    const size_t offset = ip[0] | (static_cast<size_t>(ip[1]) << 8);
    ip += 2;
    if (offset == 0 || offset > static_cast<size_t>(op - dst))
      return Error(bad, "lz4: match offset ", offset, " at output byte ", op - dst,
                   " points before the output's start");
    size_t len = token & 15;
    if (len == 15 && !read_length(&len))
      return Error(bad, "lz4: the block ends inside a match length");
    len += kMinMatch;
    if (len > static_cast<size_t>(oend - op))
      return Error(bad, "lz4: a match of ", len, " bytes would write past the ", dst_size,
                   " bytes expected");
    const uint8_t* match = op - offset;
    if (offset >= 16 && static_cast<size_t>(oend - op) >= len + 15) {
      // Fast path: 16-byte pieces; each reads only bytes written before it (offset >= 16) and
      // the last may run up to 15 bytes past the match, within the output.
      for (size_t k = 0; k < len; k += 16) std::memcpy(op + k, match + k, 16);
      op += len;
    } else if (len <= offset) {
      std::memcpy(op, match, len);
      op += len;
    } else {
      // An overlapping match repeats the last `offset` bytes. Copy from the fixed start in
      // pieces no longer than the distance to the write position: each piece is a plain
      // memcpy, and the pieces double (a run of one byte value takes log2(len) copies).
      for (size_t left = len; left > 0;) {
        const size_t piece = std::min(left, static_cast<size_t>(op - match));
        std::memcpy(op, match, piece);
        op += piece;
        left -= piece;
      }
    }
  }
  if (op != oend)
    return Error(bad, "lz4: the block decodes to ", op - dst, " bytes, expected ", dst_size);
  return Status::OK();
}

}  // namespace lz4
}  // namespace memoire
