// ReplayMemory checkpoints: SaveTo / LoadFrom (declared in replay_memory.h).
//
// File format, version 1. Native little-endian values; every section is followed by an 8-byte
// checksum of its bytes (a 64-bit multiply-rotate hash, seeded by the section's number, so a
// section moved elsewhere fails too):
//   0  header     Header below (680 bytes): magic "MEMOIRRM", version, byte-order mark,
//                 max_step, the 7 fields' dtype and shape, reward elements, the positions
//                 head (first stored entry) <= open_start <= tail (next entry), the episode
//                 count, whether an episode is open, uuid, the generator's state, and every
//                 setting but the per-reward-element ones.
//   1  settings   discount_factor float32[R], reward_coeff float32[R]
//   2  episodes   lengths int64[E], terminated uint8[E] (closed episodes, oldest first; they
//                 are consecutive from head and end at open_start)
//   3..9 fields   s, a, r, p, v, q, i: rows of positions head .. tail-1, in that order,
//                 [tail - head, *shape] of the field's dtype
//   10 weights    float32[tail - head]: init_w for the open episode, w for closed ones
// A memory with compressed states (compress_states) writes its states decoded, piece by piece,
// and encodes them again as it loads: the file is the same whichever memory wrote it, and
// either kind of memory loads it.
// The sum tree is not stored: its leaves follow from the weights and the settings, and its
// inner nodes are exact sums (SumTree::kExactSums), so rebuilding it gives the saved tree bit
// for bit, and the same generator state draws the same batches.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/replay_memory.h"

namespace memoire {
namespace {

constexpr char kMagic[8] = {'M', 'E', 'M', 'O', 'I', 'R', 'R', 'M'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kByteOrderMark = 0x01020304;
constexpr int kMaxDims = 8;  // Schema::Make's bound
constexpr int64_t kMaxPosition = int64_t{1} << 62;  // positions stay far from overflow
constexpr int kNumSections = 11;
constexpr const char* kSectionNames[kNumSections] = {
    "header",  "settings", "episodes", "field s", "field a", "field r",
    "field p", "field v",  "field q",  "field i", "weights"};

struct FieldDesc {
  uint32_t dtype;
  uint32_t ndim;
  int64_t dims[kMaxDims];
};

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t byte_order;
  int64_t max_step;
  FieldDesc fields[ReplayMemory::kNumFields];
  int64_t reward_elems;
  int64_t head, open_start, tail;
  int64_t num_episode;
  uint64_t uuid;
  uint64_t rng[4];
  double priority_exponent, priority_epsilon, mix_lambda;
  int32_t frame_stack, multi_step;
  int64_t cache_size, max_episode;
  uint8_t open, reuse_cache, allow_nonfinite, pad0[5];
  uint8_t cache_flags[ReplayMemory::kNumCacheFlags];
  uint8_t pad1[2];
};
static_assert(std::is_trivially_copyable<Header>::value, "Header is written as bytes");
static_assert(sizeof(Header) == 680, "Header has no implicit padding");

// ---- checksum: xxHash64's structure (4 lanes over 32-byte stripes, then the tail) ----------

constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full,
                   P3 = 0x165667B19E3779F9ull, P4 = 0x85EBCA77C2B2AE63ull,
                   P5 = 0x27D4EB2F165667C5ull;
inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
inline uint64_t Round(uint64_t acc, uint64_t in) { return Rotl(acc + in * P2, 31) * P1; }
inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

class Hasher {
 public:
  explicit Hasher(uint64_t seed) : seed_(seed) {
    v_[0] = seed + P1 + P2;
    v_[1] = seed + P2;
    v_[2] = seed;
    v_[3] = seed - P1;
  }
  void Update(const uint8_t* p, size_t n) {
    total_ += n;
    if (held_ > 0) {
      const size_t take = std::min(n, 32 - held_);
      std::memcpy(buf_ + held_, p, take);
      held_ += take;
      p += take;
      n -= take;
      if (held_ < 32) return;
      Stripe(buf_);
      held_ = 0;
    }
    // The lanes live in locals: stores through v_ could alias `p` (bytes alias anything), so
    // the compiler would reload and store them on every stripe.
    uint64_t a = v_[0], b = v_[1], c = v_[2], d = v_[3];
    for (; n >= 32; p += 32, n -= 32) {
      a = Round(a, Load64(p));
      b = Round(b, Load64(p + 8));
      c = Round(c, Load64(p + 16));
      d = Round(d, Load64(p + 24));
    }
    v_[0] = a;
    v_[1] = b;
    v_[2] = c;
    v_[3] = d;
    std::memcpy(buf_, p, n);
    held_ = n;
  }
  uint64_t Final() const {
    uint64_t h;
    if (total_ >= 32) {
      h = Rotl(v_[0], 1) + Rotl(v_[1], 7) + Rotl(v_[2], 12) + Rotl(v_[3], 18);
      for (uint64_t v : v_) h = (h ^ Round(0, v)) * P1 + P4;
    } else {
      h = seed_ + P5;
    }
    h += total_;
    size_t i = 0;
    for (; i + 8 <= held_; i += 8) h = Rotl(h ^ Round(0, Load64(buf_ + i)), 27) * P1 + P4;
    for (; i < held_; ++i) h = Rotl(h ^ (buf_[i] * P5), 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
  }

 private:
  void Stripe(const uint8_t* p) {
    for (int k = 0; k < 4; ++k) v_[k] = Round(v_[k], Load64(p + 8 * k));
  }
  uint64_t seed_;
  uint64_t v_[4];
  uint8_t buf_[32];
  size_t held_ = 0;
  uint64_t total_ = 0;
};

Status IoError(const char* what) {
  const int e = errno;
  return Error(Code::kInternal, "checkpoint: ", what, " failed: ", std::strerror(e))
      .With("errno", e);
}

// Writes sections: each Put is hashed and written in pieces (the piece just hashed is still
// in cache when it is written); End appends the checksum.
class SectionWriter {
 public:
  explicit SectionWriter(int fd) : fd_(fd) {}
  void Begin(int section) { hash_ = Hasher(static_cast<uint64_t>(section)); }
  Status Put(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const size_t piece = std::min(n, ReplayMemory::kCheckpointPiece);
      hash_.Update(p, piece);
      MEMOIRE_RETURN_IF_ERROR(Write(p, piece));
      p += piece;
      n -= piece;
    }
    return Status::OK();
  }
  Status End() {
    const uint64_t h = hash_.Final();
    return Write(reinterpret_cast<const uint8_t*>(&h), sizeof h);
  }

 private:
  Status Write(const uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return IoError("write");
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return Status::OK();
  }
  int fd_;
  Hasher hash_{0};
};

// Reads sections the same way; End compares the stored checksum.
class SectionReader {
 public:
  explicit SectionReader(int fd) : fd_(fd) {}
  void Begin(int section) {
    section_ = section;
    hash_ = Hasher(static_cast<uint64_t>(section));
  }
  Status Get(void* data, size_t n) {
    uint8_t* p = static_cast<uint8_t*>(data);
    while (n > 0) {
      const size_t piece = std::min(n, ReplayMemory::kCheckpointPiece);
      MEMOIRE_RETURN_IF_ERROR(Read(p, piece));
      hash_.Update(p, piece);
      p += piece;
      n -= piece;
    }
    return Status::OK();
  }
  Status End() {
    uint64_t stored = 0;
    MEMOIRE_RETURN_IF_ERROR(Read(reinterpret_cast<uint8_t*>(&stored), sizeof stored));
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
    if (stored != hash_.Final())
      return Error(Code::kDataLoss, "the ", kSectionNames[section_],
                   " section fails its checksum (the file is corrupt or was altered)");
#else
    // A fuzz build (scripts/fuzz.sh, cpp/fuzz/) takes any checksum, so that mutated files
    // reach the checks behind it; every other check still runs.
    (void)stored;
#endif
    return Status::OK();
  }

 private:
  Status Read(uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t r = ::read(fd_, p, n);
      if (r < 0) {
        if (errno == EINTR) continue;
        return IoError("read");
      }
      if (r == 0)
        return Error(Code::kDataLoss, "truncated in the ", kSectionNames[section_],
                     " section (the file shrank while it was read)");
      p += r;
      n -= static_cast<size_t>(r);
    }
    return Status::OK();
  }
  int fd_;
  int section_ = 0;
  Hasher hash_{0};
};

std::string DescribeDesc(const FieldDesc& d) {
  Field f;
  f.dtype = static_cast<DType>(d.dtype);
  for (uint32_t k = 0; k < d.ndim; ++k) f.shape.push_back(d.dims[k]);
  return f.Describe();
}

}  // namespace

uint64_t ReplayMemory::CheckpointChecksum(const void* data, size_t n, int section) {
  Hasher h(static_cast<uint64_t>(section));
  h.Update(static_cast<const uint8_t*>(data), n);
  return h.Final();
}

Status ReplayMemory::SaveTo(int fd) const {
  std::lock_guard<RwLock> l(mu_);
  Header h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.byte_order = kByteOrderMark;
  h.max_step = max_step_;
  for (int f = 0; f < kNumFields; ++f) {
    const Field& field = schema_.field(f);
    h.fields[f].dtype = static_cast<uint32_t>(field.dtype);
    h.fields[f].ndim = static_cast<uint32_t>(field.shape.size());
    std::copy(field.shape.begin(), field.shape.end(), h.fields[f].dims);
  }
  h.reward_elems = reward_elems_;
  const int64_t head = head_locked();
  h.head = head;
  h.open_start = open_start_;
  h.tail = tail_;
  h.num_episode = static_cast<int64_t>(episodes_.size());
  h.uuid = uuid_;
  const auto rng = rng_.state();
  std::copy(rng.begin(), rng.end(), h.rng);
  h.priority_exponent = opt_.priority_exponent;
  h.priority_epsilon = opt_.priority_epsilon;
  h.mix_lambda = opt_.mix_lambda;
  h.frame_stack = opt_.frame_stack;
  h.multi_step = opt_.multi_step;
  h.cache_size = opt_.cache_size;
  h.max_episode = opt_.max_episode;
  h.open = open_ ? 1 : 0;
  h.reuse_cache = opt_.reuse_cache ? 1 : 0;
  h.allow_nonfinite = opt_.allow_nonfinite ? 1 : 0;
  std::copy(opt_.cache_flags.begin(), opt_.cache_flags.end(), h.cache_flags);

  SectionWriter w(fd);
  w.Begin(0);
  MEMOIRE_RETURN_IF_ERROR(w.Put(&h, sizeof h));
  MEMOIRE_RETURN_IF_ERROR(w.End());

  w.Begin(1);
  MEMOIRE_RETURN_IF_ERROR(w.Put(opt_.discount_factor.data(), reward_elems_ * sizeof(float)));
  MEMOIRE_RETURN_IF_ERROR(w.Put(opt_.reward_coeff.data(), reward_elems_ * sizeof(float)));
  MEMOIRE_RETURN_IF_ERROR(w.End());

  std::vector<int64_t> lengths;
  std::vector<uint8_t> terminated;
  lengths.reserve(episodes_.size());
  terminated.reserve(episodes_.size());
  for (const Episode& e : episodes_) {
    lengths.push_back(e.length);
    terminated.push_back(ep_term_[e.start % max_step_]);
  }
  w.Begin(2);
  MEMOIRE_RETURN_IF_ERROR(w.Put(lengths.data(), lengths.size() * sizeof(int64_t)));
  MEMOIRE_RETURN_IF_ERROR(w.Put(terminated.data(), terminated.size()));
  MEMOIRE_RETURN_IF_ERROR(w.End());

  // Positions head .. tail-1 are at most two runs of slots: to the ring's end, then from 0.
  const int64_t n = tail_ - head;
  const int64_t slot0 = n > 0 ? head % max_step_ : 0;
  const int64_t run1 = std::min(n, max_step_ - slot0);
  for (int f = 0; f < kNumFields; ++f) {
    const size_t rb = row_bytes(f);
    w.Begin(3 + f);
    if (f == kState && states_) {
      // Decoded a piece of rows at a time (no second copy of the states).
      const int64_t per_piece = std::max<int64_t>(1, kCheckpointPiece / std::max<size_t>(rb, 1));
      std::vector<uint8_t> piece(static_cast<size_t>(std::min(n, per_piece)) * rb);
      std::vector<int64_t> slots;
      for (int64_t done = 0; done < n;) {
        const int64_t k = std::min(n - done, per_piece);
        slots.resize(k);
        for (int64_t j = 0; j < k; ++j) slots[j] = (head + done + j) % max_step_;
        MEMOIRE_RETURN_IF_ERROR(states_->Decode(slots.data(), k, piece.data()));
        MEMOIRE_RETURN_IF_ERROR(w.Put(piece.data(), k * rb));
        done += k;
      }
    } else {
      MEMOIRE_RETURN_IF_ERROR(w.Put(cols_.row(f, slot0), run1 * rb));
      MEMOIRE_RETURN_IF_ERROR(w.Put(cols_.row(f, 0), (n - run1) * rb));
    }
    MEMOIRE_RETURN_IF_ERROR(w.End());
  }
  w.Begin(10);
  MEMOIRE_RETURN_IF_ERROR(w.Put(weight_.data() + slot0, run1 * sizeof(float)));
  MEMOIRE_RETURN_IF_ERROR(w.Put(weight_.data(), (n - run1) * sizeof(float)));
  return w.End();
}

Status ReplayMemory::LoadFrom(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoError("fstat");
  if (!S_ISREG(st.st_mode))
    return Error(Code::kDataLoss, "not a regular file (a FIFO, device, socket or folder)");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (::lseek(fd, 0, SEEK_SET) < 0) return IoError("seek");

  // ---- the header: identity first, then its checksum, then every count it claims
  SectionReader r(fd);
  Header h;
  std::memset(&h, 0, sizeof h);
  constexpr uint64_t kHeaderBytes = sizeof(Header) + 8;
  if (file_bytes < sizeof kMagic || file_bytes < kHeaderBytes) {
    // Too short for a header: say whether it even starts like a checkpoint.
    char magic[sizeof kMagic] = {};
    const ssize_t got = ::read(fd, magic, std::min<uint64_t>(file_bytes, sizeof kMagic));
    if (got == static_cast<ssize_t>(sizeof kMagic) && std::memcmp(magic, kMagic, sizeof kMagic) == 0)
      return Error(Code::kDataLoss, "truncated: a checkpoint header needs ", kHeaderBytes,
                   " bytes, the file has ", file_bytes);
    return Error(Code::kDataLoss, "not a memoire ReplayMemory checkpoint (expected the magic "
                 "'MEMOIRRM', the file has ", file_bytes, " bytes)");
  }
  r.Begin(0);
  MEMOIRE_RETURN_IF_ERROR(r.Get(&h, sizeof h));
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0)
    return Error(Code::kDataLoss,
                 "not a memoire ReplayMemory checkpoint (expected the magic 'MEMOIRRM')");
  if (h.version != kVersion)
    return Error(Code::kDataLoss, "checkpoint format version ", h.version,
                 "; this memoire reads version ", kVersion);
  if (h.byte_order != kByteOrderMark)
    return Error(Code::kDataLoss,
                 "written on a machine of another byte order; this memoire reads its own");
  MEMOIRE_RETURN_IF_ERROR(r.End());

  if (h.max_step != max_step_)
    return Error(Code::kDataLoss, "expected max_step=", max_step_, " (this memory's), got ",
                 h.max_step);
  for (int f = 0; f < kNumFields; ++f) {
    const Field& mine = schema_.field(f);
    const FieldDesc& d = h.fields[f];
    bool same = d.dtype == static_cast<uint32_t>(mine.dtype) && d.ndim == mine.shape.size();
    for (uint32_t k = 0; same && k < d.ndim; ++k) same = d.dims[k] == mine.shape[k];
    if (!same) {
      const bool describable = d.dtype < static_cast<uint32_t>(kNumDTypes) && d.ndim <= kMaxDims;
      return Error(Code::kDataLoss, "field ", kFieldNames[f], ": expected ", mine.Describe(),
                   " (this memory's template), got ",
                   describable ? DescribeDesc(d) : std::string("an invalid dtype or shape"));
    }
  }
  if (h.reward_elems != reward_elems_)
    return Error(Code::kDataLoss, "expected ", reward_elems_, " reward elements, got ",
                 h.reward_elems);
  if (!(0 <= h.head && h.head <= h.open_start && h.open_start <= h.tail &&
        h.tail <= kMaxPosition))
    return Error(Code::kDataLoss, "expected positions 0 <= head <= open_start <= tail <= 2**62, "
                 "got head=", h.head, " open_start=", h.open_start, " tail=", h.tail);
  const int64_t n = h.tail - h.head;
  if (n > max_step_)
    return Error(Code::kDataLoss, "expected at most max_step=", max_step_,
                 " stored entries, got ", n);
  if (h.open > 1 || (!h.open && h.open_start != h.tail))
    return Error(Code::kDataLoss, "expected open 0 or 1 (and open_start == tail when 0), got "
                 "open=", int(h.open), " open_start=", h.open_start, " tail=", h.tail);
  const int64_t closed = h.open_start - h.head;
  if (h.num_episode < 0 || h.num_episode > closed || (closed > 0 && h.num_episode == 0))
    return Error(Code::kDataLoss, "expected between 1 and ", closed, " episodes for ", closed,
                 " entries in closed episodes, got ", h.num_episode);
  const uint64_t zero_rng[4] = {0, 0, 0, 0};
  if (std::memcmp(h.rng, zero_rng, sizeof zero_rng) == 0)
    return Error(Code::kDataLoss, "expected a generator state that is not all zeros");
  // The file's exact size, from the counts just checked (each term far below 2**63).
  const uint64_t E = static_cast<uint64_t>(h.num_episode);
  uint64_t expected = kHeaderBytes + (2 * reward_elems_ * sizeof(float) + 8) + (E * 9 + 8) +
                      (static_cast<uint64_t>(n) * sizeof(float) + 8);
  for (int f = 0; f < kNumFields; ++f)
    expected += static_cast<uint64_t>(n) * row_bytes(f) + 8;
  if (file_bytes != expected)
    return Error(Code::kDataLoss, file_bytes < expected ? "truncated: " : "",
                 "expected ", expected, " bytes for ", n, " entries and ", E,
                 " episodes, the file has ", file_bytes);

  // ---- the rest goes into a staging memory; this one changes only once all of it is read
  std::unique_ptr<ReplayMemory> s(new ReplayMemory(schema_, max_step_, states_ != nullptr));
  if (!s->Allocated())
    return Error(Code::kResourceExhausted, "load: cannot allocate ",
                 schema_.row_bytes() * max_step_, " bytes for max_step=", max_step_);
  Options o;
  o.priority_exponent = h.priority_exponent;
  o.priority_epsilon = h.priority_epsilon;
  o.mix_lambda = h.mix_lambda;
  o.frame_stack = h.frame_stack;
  o.multi_step = h.multi_step;
  o.cache_size = h.cache_size;
  o.max_episode = h.max_episode;
  o.reuse_cache = h.reuse_cache != 0;
  o.allow_nonfinite = h.allow_nonfinite != 0;
  o.cache_flags.assign(h.cache_flags, h.cache_flags + kNumCacheFlags);
  o.discount_factor.resize(reward_elems_);
  o.reward_coeff.resize(reward_elems_);
  r.Begin(1);
  MEMOIRE_RETURN_IF_ERROR(r.Get(o.discount_factor.data(), reward_elems_ * sizeof(float)));
  MEMOIRE_RETURN_IF_ERROR(r.Get(o.reward_coeff.data(), reward_elems_ * sizeof(float)));
  MEMOIRE_RETURN_IF_ERROR(r.End());
  if (h.reuse_cache > 1 || h.allow_nonfinite > 1 ||
      std::any_of(h.cache_flags, h.cache_flags + kNumCacheFlags, [](uint8_t x) { return x > 1; }))
    return Error(Code::kDataLoss, "settings: expected flags of 0 or 1");
  {
    const Status valid = ValidateOptions(o);
    if (!valid.ok()) return Error(Code::kDataLoss, "settings: ", valid.message());
  }
  if (o.max_episode > 0 && h.num_episode > o.max_episode)
    return Error(Code::kDataLoss, "expected at most max_episode=", o.max_episode,
                 " episodes, got ", h.num_episode);

  std::vector<int64_t> lengths(E);
  std::vector<uint8_t> terminated(E);
  r.Begin(2);
  MEMOIRE_RETURN_IF_ERROR(r.Get(lengths.data(), E * sizeof(int64_t)));
  MEMOIRE_RETURN_IF_ERROR(r.Get(terminated.data(), E));
  MEMOIRE_RETURN_IF_ERROR(r.End());
  int64_t sum = 0;
  for (uint64_t e = 0; e < E; ++e) {
    if (lengths[e] < 1 || lengths[e] > closed - sum || terminated[e] > 1)
      return Error(Code::kDataLoss, "episode ", e, ": expected a length in [1, ", closed - sum,
                   "] and terminated 0 or 1, got ", lengths[e], " and ", int(terminated[e]));
    sum += lengths[e];
  }
  if (sum != closed)
    return Error(Code::kDataLoss, "expected episode lengths summing to ", closed, ", got ", sum);

  const int64_t slot0 = n > 0 ? h.head % max_step_ : 0;
  const int64_t run1 = std::min(n, max_step_ - slot0);
  for (int f = 0; f < kNumFields; ++f) {
    const size_t rb = row_bytes(f);
    r.Begin(3 + f);
    if (f == kState && s->states_) {
      // Read a piece of rows at a time and encode them (the checksum covers the raw rows).
      const int64_t per_piece = std::max<int64_t>(1, kCheckpointPiece / std::max<size_t>(rb, 1));
      std::vector<uint8_t> piece(static_cast<size_t>(std::min(n, per_piece)) * rb);
      for (int64_t done = 0; done < n;) {
        const int64_t k = std::min(n - done, per_piece);
        MEMOIRE_RETURN_IF_ERROR(r.Get(piece.data(), k * rb));
        std::vector<CompressedRows::Blob> blobs = CompressedRows::Encode(piece.data(), k, rb);
        for (int64_t j = 0; j < k; ++j)
          s->states_->Put((h.head + done + j) % max_step_, std::move(blobs[j]));
        done += k;
      }
    } else {
      MEMOIRE_RETURN_IF_ERROR(r.Get(s->cols_.row(f, slot0), run1 * rb));
      MEMOIRE_RETURN_IF_ERROR(r.Get(s->cols_.row(f, 0), (n - run1) * rb));
    }
    MEMOIRE_RETURN_IF_ERROR(r.End());
  }
  r.Begin(10);
  MEMOIRE_RETURN_IF_ERROR(r.Get(s->weight_.data() + slot0, run1 * sizeof(float)));
  MEMOIRE_RETURN_IF_ERROR(r.Get(s->weight_.data(), (n - run1) * sizeof(float)));
  MEMOIRE_RETURN_IF_ERROR(r.End());
  for (int64_t p = h.head; p < h.tail; ++p) {
    const float x = s->weight_[p % max_step_];
    if (!(x >= 0) || !std::isfinite(x))
      return Error(Code::kDataLoss, "weights: expected finite values >= 0, got ", x,
                   " at entry ", p - h.head);
  }

  // ---- everything was read and checked: build the staging memory's bookkeeping, then adopt
  s->opt_ = o;
  s->uuid_ = h.uuid;
  s->rng_.set_state({h.rng[0], h.rng[1], h.rng[2], h.rng[3]});
  int64_t p = h.head;
  for (uint64_t e = 0; e < E; ++e) {
    const int64_t start = p;
    for (; p < start + lengths[e]; ++p) {
      const int64_t slot = p % max_step_;
      s->set_pos(slot, p);
      s->ep_start_[slot] = start;
      s->ep_len_[slot] = lengths[e];
      s->ep_term_[slot] = terminated[e];
    }
    s->episodes_.push_back({start, lengths[e]});
  }
  for (; p < h.tail; ++p) {  // the open episode's entries
    const int64_t slot = p % max_step_;
    s->set_pos(slot, p);
    s->ep_start_[slot] = h.open_start;
  }
  s->open_ = h.open != 0;
  s->open_start_ = h.open_start;
  s->tail_ = h.tail;
  s->total_added_ = static_cast<uint64_t>(h.tail);  // entries ever added, less discarded ones
  s->RebuildTreeLocked();
  std::lock_guard<RwLock> l(mu_);
  AdoptLocked(*s);
  return Status::OK();
}

void ReplayMemory::AdoptLocked(ReplayMemory& o) {
  opt_ = o.opt_;
  uuid_ = o.uuid_;
  cols_.TakeContents(o.cols_);
  if (states_) states_->swap(*o.states_);  // the staging memory compresses as this one does
  weight_.swap(o.weight_);
  pos1_.swap(o.pos1_);
  ep_start_.swap(o.ep_start_);
  ep_len_.swap(o.ep_len_);
  ep_term_.swap(o.ep_term_);
  std::swap(tree_, o.tree_);
  rng_ = o.rng_;
  episodes_.swap(o.episodes_);
  open_ = o.open_;
  open_start_ = o.open_start_;
  tail_ = o.tail_;
  sampleable_ = o.sampleable_;
  total_added_ = o.total_added_;
}

}  // namespace memoire
