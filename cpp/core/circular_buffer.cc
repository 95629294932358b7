#include "core/circular_buffer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>

#include "core/gather.h"

// Products and sums must round exactly as numpy's do: never fuse a multiply and an add.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace memoire {

namespace {

template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// numpy's truth value of one element (NaN is true, -0.0 is false).
bool NonZero(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kFloat16: return (LoadUnaligned<uint16_t>(p) & 0x7fff) != 0;
    case DType::kFloat32: return LoadUnaligned<float>(p) != 0.0f || std::isnan(LoadUnaligned<float>(p));
    case DType::kFloat64: return LoadUnaligned<double>(p) != 0.0 || std::isnan(LoadUnaligned<double>(p));
    default: {
      const size_t n = ItemSize(t);
      for (size_t i = 0; i < n; ++i)
        if (p[i]) return true;
      return false;
    }
  }
}

// Reads element of type t as R (numpy's cast to the promoted type).
template <typename R>
R ReadAs(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kBool: return static_cast<R>(p[0] != 0);
    case DType::kInt8: return static_cast<R>(LoadUnaligned<int8_t>(p));
    case DType::kUInt8: return static_cast<R>(LoadUnaligned<uint8_t>(p));
    case DType::kInt16: return static_cast<R>(LoadUnaligned<int16_t>(p));
    case DType::kUInt16: return static_cast<R>(LoadUnaligned<uint16_t>(p));
    case DType::kInt32: return static_cast<R>(LoadUnaligned<int32_t>(p));
    case DType::kUInt32: return static_cast<R>(LoadUnaligned<uint32_t>(p));
    case DType::kInt64: return static_cast<R>(LoadUnaligned<int64_t>(p));
    case DType::kUInt64: return static_cast<R>(LoadUnaligned<uint64_t>(p));
    case DType::kFloat32: return static_cast<R>(LoadUnaligned<float>(p));
    case DType::kFloat64: return static_cast<R>(LoadUnaligned<double>(p));
    case DType::kFloat16: return 0;  // rejected by Make
  }
  return 0;
}

// Casts a float to an integer type the way numpy's C cast does on x86-64 (out of range and
// NaN give the most negative int64, truncated).
template <typename I, typename R>
I FloatToInt(R v) {
  if (!(v >= static_cast<R>(-9.2233720368547758e18) && v < static_cast<R>(9.2233720368547758e18))) {
    if (std::is_same<I, uint64_t>::value && v >= static_cast<R>(9.2233720368547758e18) &&
        v < static_cast<R>(1.8446744073709552e19))
      return static_cast<I>(static_cast<uint64_t>(v));
    return static_cast<I>(std::numeric_limits<int64_t>::min());
  }
  return static_cast<I>(static_cast<int64_t>(v));
}

template <typename R>
void WriteAs(DType t, R v, uint8_t* p) {
  switch (t) {
    case DType::kBool: p[0] = (v != 0) ? 1 : 0; return;
    case DType::kInt8: Store(p, FloatToInt<int8_t>(v)); return;
    case DType::kUInt8: Store(p, FloatToInt<uint8_t>(v)); return;
    case DType::kInt16: Store(p, FloatToInt<int16_t>(v)); return;
    case DType::kUInt16: Store(p, FloatToInt<uint16_t>(v)); return;
    case DType::kInt32: Store(p, FloatToInt<int32_t>(v)); return;
    case DType::kUInt32: Store(p, FloatToInt<uint32_t>(v)); return;
    case DType::kInt64: Store(p, FloatToInt<int64_t>(v)); return;
    case DType::kUInt64: Store(p, FloatToInt<uint64_t>(v)); return;
    case DType::kFloat32: Store(p, static_cast<float>(v)); return;
    case DType::kFloat64: Store(p, static_cast<double>(v)); return;
    case DType::kFloat16: return;
  }
}

// numpy's add.reduce over a contiguous 1-D array (pairwise summation, 8 lanes, blocks of 128).
template <typename R>
R PairwiseSum(const R* a, int64_t n) {
  if (n < 8) {
    R res = 0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    R r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    R res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return PairwiseSum(a, n2) + PairwiseSum(a + n2, n - n2);
}

// float32 * reward dtype promotes to float32 for small types, float64 otherwise (numpy rules).
bool RewardComputesInDouble(DType t) {
  switch (t) {
    case DType::kInt32: case DType::kUInt32: case DType::kInt64: case DType::kUInt64:
    case DType::kFloat64:
      return true;
    default:
      return false;
  }
}

// A shape as text for messages: "(3,)" and "(3,2)".
std::string NpShape(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  if (shape.size() == 1) os << ",";
  os << ")";
  return os.str();
}

// Gather's errors where Dopamine's get_range asserts: an index its ring arithmetic rejects, and
// a slot not yet written (detail "key": the start of the range, which Dopamine's text names).
Status OutsideRing(int64_t index, int64_t capacity) {
  return Error(Code::kOutOfRange, "indices: ", index, " is outside the ring of ", capacity,
               " slots").With("index", index).With("bound", capacity);
}
Status NotAdded(int64_t slot) {
  return Error(Code::kNotFound, "slot ", slot, " has not been added").With("key", slot);
}

Status AttemptsExhausted(int64_t attempts, int64_t sampled, int64_t n) {
  return Error(Code::kFailedPrecondition, "sample: ", attempts,
               " invalid draws (max_sample_attempts) with ", sampled, " of ", n,
               " valid indices drawn").With("sampled", sampled);
}

}  // namespace

CircularBuffer::CircularBuffer(Columns columns, const Options& options)
    : options_(options),
      columns_(std::move(columns)),
      episode_end_(static_cast<size_t>(options.capacity)),
      tree_(options.prioritized ? options.capacity : 0),
      rng_(options.seed) {
  while (padded_leaves_ < options.capacity) padded_leaves_ <<= 1;
  for (int k = 0; k < options.update_horizon; ++k)
    discount_.push_back(static_cast<float>(std::pow(options.gamma, static_cast<double>(k))));
  size_t widest = 0;
  for (size_t f = 0; f < schema().size(); ++f) widest = std::max(widest, schema().field(f).bytes());
  zero_row_.assign(widest + 1, 0);
  const DType term = schema().field(kTerminal).dtype;
  switch (term) {
    case DType::kFloat16: Store<uint16_t>(terminal_one_, 0x3C00); break;
    case DType::kFloat32: Store<float>(terminal_one_, 1.0f); break;
    case DType::kFloat64: Store<double>(terminal_one_, 1.0); break;
    default: terminal_one_[0] = 1; break;  // little-endian integers and bool
  }
}

Status CircularBuffer::Make(const Schema& schema, const Options& options,
                            std::unique_ptr<CircularBuffer>* out) {
  if (options.stack_size < 1)
    return Error(Code::kInvalidArgument, "stack_size: expected >= 1, got ", options.stack_size);
  if (options.update_horizon < 1)
    return Error(Code::kInvalidArgument, "update_horizon: expected >= 1, got ",
                 options.update_horizon);
  if (options.capacity < static_cast<int64_t>(options.update_horizon) + options.stack_size)
    return Error(Code::kInvalidArgument, "capacity: expected >= stack_size + update_horizon = ",
                 static_cast<int64_t>(options.update_horizon) + options.stack_size, ", got ",
                 options.capacity);
  if (options.max_sample_attempts < 0)
    return Error(Code::kInvalidArgument, "max_sample_attempts: expected >= 0, got ",
                 options.max_sample_attempts);
  static const char* kNames[4] = {"observation", "action", "reward", "terminal"};
  if (schema.size() < 4)
    return Error(Code::kInvalidArgument, "schema: expected at least the fields observation, "
                 "action, reward, terminal; got ", schema.size(), " fields");
  for (int f = 0; f < 4; ++f)
    if (schema.field(f).name != kNames[f])
      return Error(Code::kInvalidArgument, "schema: field ", f, " must be '", kNames[f],
                   "', got '", schema.field(f).name, "'");
  if (!schema.field(kTerminal).shape.empty())
    return Error(Code::kInvalidArgument, "terminal: expected a scalar field, got ",
                 schema.field(kTerminal).Describe());
  if (schema.field(kReward).dtype == DType::kFloat16)
    return Error(Code::kInvalidArgument,
                 "reward_dtype: float16 is not supported (use float32 or float64)");
  Columns columns(schema, options.capacity);
  if (!columns.allocated())
    return Error(Code::kResourceExhausted, "cannot allocate ", schema.row_bytes(), " bytes x ",
                 options.capacity, " slots");
  std::unique_ptr<CircularBuffer> made;
  try {
    made.reset(new CircularBuffer(std::move(columns), options));  // the tree may throw
  } catch (const std::bad_alloc&) {
  }
  if (!made || !made->episode_end_.allocated())
    return Error(Code::kResourceExhausted, "cannot reserve the per-slot records of ",
                 options.capacity, " slots");
  *out = std::move(made);
  return Status::OK();
}

bool CircularBuffer::Terminal(int64_t slot) const {
  return NonZero(schema().field(kTerminal).dtype, columns_.row(kTerminal, slot));
}

Status CircularBuffer::CheckPriority(double p) const {
  if (std::isnan(p) || std::isinf(p))
    return Error(Code::kInvalidArgument, "priority: expected a finite value >= 0, got ", p);
  if (p < 0.0) return Error(Code::kInvalidArgument, "priority: expected a value >= 0, got ", p);
  return Status::OK();
}

void CircularBuffer::SetLeaf(int64_t slot, double priority) {
  // Dopamine adds the delta to the old leaf; the leaf can differ from `priority` by rounding.
  const double old = tree_.Get(slot);
  const double prev_max = tree_.max_recorded();
  tree_.Set(slot, old + (priority - old));
  // Python's max(value, recorded) keeps `value` unless recorded is strictly larger.
  tree_.set_max_recorded(prev_max > priority ? prev_max : priority);
}

void CircularBuffer::WriteRow(const void* const* rows, int64_t row_index, bool episode_end,
                              double priority) {
  const int nf = static_cast<int>(schema().size());
  if (next_is_episode_start_) {
    for (int k = 0; k < options_.stack_size - 1; ++k) {
      const int64_t c = cursor();
      episode_end_[c] = 0;
      for (int f = 0; f < nf; ++f) columns_.Zero(f, c);
      if (options_.prioritized) SetLeaf(c, 0.0);
      ++add_count_;
    }
    next_is_episode_start_ = false;
  }
  const int64_t c = cursor();
  episode_end_[c] = episode_end ? 1 : 0;
  if (episode_end) next_is_episode_start_ = true;
  for (int f = 0; f < nf; ++f)
    columns_.Write(f, c, static_cast<const uint8_t*>(rows[f]) + row_index * columns_.row_bytes(f));
  if (options_.prioritized) SetLeaf(c, priority);
  ++add_count_;
}

Status CircularBuffer::CheckRoomLocked(int64_t k) const {
  // Division, not k * stack_size: that product may itself overflow for an absurd k.
  if (k > (kMaxAddCount - add_count_) / options_.stack_size)
    return Error(Code::kResourceExhausted, "add_count: ", k, " more add(s) from ", add_count_,
                 " would pass the limit 2**62 (was add_count set to a huge value?)");
  return Status::OK();
}

Status CircularBuffer::Add(const void* const* rows, bool episode_end, double priority) {
  std::lock_guard<std::mutex> lock(mu_);
  MEMOIRE_RETURN_IF_ERROR(CheckRoomLocked(1));
  if (options_.prioritized) MEMOIRE_RETURN_IF_ERROR(CheckPriority(priority));
  WriteRow(rows, 0, episode_end, priority);
  return Status::OK();
}

Status CircularBuffer::AddBatch(int64_t k, const void* const* columns, const uint8_t* episode_end,
                                const double* priorities) {
  if (k < 0) return Error(Code::kInvalidArgument, "batch: expected >= 0 rows, got ", k);
  std::lock_guard<std::mutex> lock(mu_);
  MEMOIRE_RETURN_IF_ERROR(CheckRoomLocked(k));
  if (options_.prioritized) {
    if (priorities == nullptr && k > 0)
      return Error(Code::kInvalidArgument, "priorities: required by a prioritized buffer");
    for (int64_t i = 0; i < k; ++i) MEMOIRE_RETURN_IF_ERROR(CheckPriority(priorities[i]));
  }
  for (int64_t i = 0; i < k; ++i)
    WriteRow(columns, i, episode_end[i] != 0, options_.prioritized ? priorities[i] : 0.0);
  return Status::OK();
}

int64_t CircularBuffer::add_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return add_count_;
}

Status CircularBuffer::set_add_count(int64_t count) {
  if (count < 0 || count > kMaxAddCount)
    return Error(Code::kInvalidArgument, "add_count: expected 0 <= add_count <= 2**62, got ",
                 count);
  std::lock_guard<std::mutex> lock(mu_);
  add_count_ = count;
  return Status::OK();
}

bool CircularBuffer::next_is_episode_start() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_is_episode_start_;
}

void CircularBuffer::set_next_is_episode_start(bool v) {
  std::lock_guard<std::mutex> lock(mu_);
  next_is_episode_start_ = v;
}

bool CircularBuffer::IsValidLocked(int64_t index) const {
  const int64_t cap = options_.capacity;
  const int64_t n = options_.update_horizon;
  const int64_t stack = options_.stack_size;
  if (index < 0 || index >= cap) return false;
  const int64_t c = cursor();
  if (!full()) {
    if (index >= c - n) return false;
    if (index < stack - 1) return false;
  }
  // Dopamine's invalid_range: the n slots before the cursor and the stack_size from it on.
  if (add_count_ > 0) {
    if (Mod(index - (c - n)) < stack + n) return false;
  } else if (index == 0) {
    return false;  // invalid_range starts as zeros
  }
  // A terminal (or, with the #213 fix, any episode end) inside the stack but its last frame.
  for (int64_t k = 1; k < stack; ++k) {
    const int64_t s = Mod(index - k);
    if (Terminal(s)) return false;
    if (options_.episode_end_breaks_stacks && episode_end_[s]) return false;
  }
  // An episode that ends by truncation within the update horizon.
  for (int64_t j = 0; j < n; ++j) {
    const int64_t s = Mod(index + j);
    if (episode_end_[s] && !Terminal(s)) return false;
  }
  return true;
}

bool CircularBuffer::IsValid(int64_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return IsValidLocked(index);
}

void CircularBuffer::IsValidMany(const int64_t* indices, int64_t n, uint8_t* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) out[i] = IsValidLocked(indices[i]) ? 1 : 0;
}

Status CircularBuffer::SampleLocked(int64_t n, int64_t* out) {
  const int64_t attempts_max = options_.max_sample_attempts;
  if (!options_.prioritized) {
    const int64_t cap = options_.capacity;
    const int64_t c = cursor();
    int64_t min_id, max_id;
    if (full()) {
      min_id = c - cap + options_.stack_size - 1;
      max_id = c - options_.update_horizon;
    } else {
      min_id = options_.stack_size - 1;
      max_id = c - options_.update_horizon;
      if (max_id <= min_id)
        return Error(Code::kFailedPrecondition, "sample: needs more than stack_size + "
                     "update_horizon = ", options_.stack_size + options_.update_horizon,
                     " slots written, got ", c)
            .With("needed", options_.stack_size + options_.update_horizon);
    }
    const uint64_t span = static_cast<uint64_t>(max_id - min_id);
    int64_t got = 0, attempts = 0;
    while (got < n && attempts < attempts_max) {
      const int64_t index = Mod(min_id + static_cast<int64_t>(rng_.Below(span)));
      if (IsValidLocked(index)) out[got++] = index;
      else ++attempts;
    }
    if (got != n) return AttemptsExhausted(attempts_max, got, n);
    return Status::OK();
  }
  MEMOIRE_RETURN_IF_ERROR(tree_.Sample(rng_, n, /*stratified=*/true, out));
  int64_t allowed = attempts_max;
  for (int64_t i = 0; i < n; ++i) {
    if (IsValidLocked(out[i])) continue;
    if (allowed == 0) return AttemptsExhausted(attempts_max, i, n);
    int64_t index = out[i];
    while (!IsValidLocked(index) && allowed > 0) {
      MEMOIRE_RETURN_IF_ERROR(tree_.Sample(rng_, 1, /*stratified=*/false, &index));
      --allowed;
    }
    out[i] = index;  // Dopamine keeps the last draw even when it is still invalid
  }
  return Status::OK();
}

Status CircularBuffer::SampleIndices(int64_t n, int64_t* out) {
  if (n < 0) return Error(Code::kInvalidArgument, "batch_size: expected >= 0, got ", n);
  std::lock_guard<std::mutex> lock(mu_);
  return SampleLocked(n, out);
}

Status CircularBuffer::GatherLocked(const int64_t* indices, int64_t n, const Outputs& out) const {
  const int64_t cap = options_.capacity;
  const int64_t stack = options_.stack_size;
  const int64_t horizon = options_.update_horizon;
  const bool is_full = full();
  const int64_t c = cursor();
  const Field& rf = schema().field(kReward);
  const std::vector<int64_t>& rshape = rf.shape;
  const int64_t r_elems = rf.num_elements();
  const int64_t r_last = rshape.empty() ? 0 : rshape.back();

  // Pass 1: the checks Dopamine's loop makes, in its order, and each trajectory's length.
  std::vector<int64_t> length(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; ++b) {
    const int64_t s = indices[b];
    // Past the ring: Dopamine's first get_range assertion below fails anyway; failing here
    // keeps s + j from overflowing for s near 2**63.
    if (s >= cap) return OutsideRing(s, cap);
    int64_t len = horizon;
    for (int64_t j = 0; j < horizon; ++j) {
      if (Terminal(Mod(s + j))) {
        len = j + 1;
        break;
      }
    }
    length[b] = len;
    const int64_t next = s + len;
    // get_range(reward, s, s + len)
    if (!(next >= 0) || !(s < cap)) return OutsideRing(s, cap);
    if (!is_full && next > c) return NotAdded(s);
    // get_range(observation, s - stack + 1, s + 1)
    if (!(s + 1 >= 0) || !(s - stack + 1 < cap)) return OutsideRing(s, cap);
    if (!is_full && s + 1 > c) return NotAdded(s - stack + 1);
    // numpy broadcasting of discount[len] * rewards[len, *reward_shape]
    if (!rshape.empty() && len > 1) {
      // numpy fails to broadcast unless the last axis is the trajectory's length, and with
      // length the sum cannot be stored back into a last axis of 1.
      if (r_last != len || r_last == 1)
        return Error(Code::kInvalidArgument, "reward: the discounts of an n-step trajectory of ",
                     len, " steps do not broadcast against rewards of shape ", NpShape(rshape))
            .With("length", len);
    }
    // get_range(observation, m - stack + 1, m + 1) with m = (s + len) % capacity
    const int64_t m = Mod(next);
    if (!is_full && m + 1 > c) return NotAdded(m - stack + 1);
  }

  // Pass 2: assembly.
  std::vector<int64_t> slots(static_cast<size_t>(n * stack));
  std::vector<int64_t> here(static_cast<size_t>(n)), there(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; ++b) {
    const int64_t s = indices[b];
    here[b] = Mod(s);
    there[b] = Mod(s + length[b]);
  }
  const Field& of = schema().field(kObservation);
  const size_t obs_item = ItemSize(of.dtype);
  const int64_t obs_elems = of.num_elements();
  if (out.state) {
    for (int64_t b = 0; b < n; ++b)
      for (int64_t k = 0; k < stack; ++k) slots[b * stack + k] = Mod(indices[b] - stack + 1 + k);
    GatherStackChannelLast(columns_.data(kObservation), obs_item, obs_elems, slots.data(), n,
                           static_cast<int>(stack), out.state);
  }
  if (out.next_state) {
    for (int64_t b = 0; b < n; ++b)
      for (int64_t k = 0; k < stack; ++k) slots[b * stack + k] = Mod(there[b] - stack + 1 + k);
    GatherStackChannelLast(columns_.data(kObservation), obs_item, obs_elems, slots.data(), n,
                           static_cast<int>(stack), out.next_state);
  }
  if (out.action) GatherRows(columns_.data(kAction), columns_.row_bytes(kAction), here.data(), n, out.action);
  if (out.next_action)
    GatherRows(columns_.data(kAction), columns_.row_bytes(kAction), there.data(), n, out.next_action);
  if (out.next_reward)
    GatherRows(columns_.data(kReward), columns_.row_bytes(kReward), there.data(), n, out.next_reward);
  for (size_t e = 0; e < out.extras.size(); ++e) {
    const int f = kFirstExtra + static_cast<int>(e);
    if (out.extras[e]) GatherRows(columns_.data(f), columns_.row_bytes(f), here.data(), n, out.extras[e]);
  }
  if (out.reward) {
    const size_t r_item = ItemSize(rf.dtype);
    const size_t r_row = columns_.row_bytes(kReward);
    auto sums = [&](auto zero) {
      using R = decltype(zero);
      std::vector<R> prod(static_cast<size_t>(horizon));
      for (int64_t b = 0; b < n; ++b) {
        const int64_t s = indices[b];
        const int64_t len = length[b];
        uint8_t* dst = out.reward + b * r_row;
        for (int64_t e = 0; e < r_elems; ++e) {
          R total;
          if (rshape.empty()) {
            for (int64_t j = 0; j < len; ++j)
              prod[j] = static_cast<R>(discount_[j]) *
                        ReadAs<R>(rf.dtype, columns_.row(kReward, Mod(s + j)) + e * r_item);
            total = R(0) + PairwiseSum(prod.data(), len);
          } else {
            // The discount broadcasts along the reward's last axis (Dopamine's vector rewards).
            const R d = static_cast<R>(discount_[len == 1 ? 0 : e % r_last]);
            total = R(0);
            for (int64_t j = 0; j < len; ++j) {
              const R p = d * ReadAs<R>(rf.dtype, columns_.row(kReward, Mod(s + j)) + e * r_item);
              total += p;
            }
          }
          WriteAs<R>(rf.dtype, total, dst + e * r_item);
        }
      }
    };
    if (RewardComputesInDouble(rf.dtype)) sums(0.0);
    else sums(0.0f);
  }
  if (out.terminal) {
    const size_t t_item = columns_.row_bytes(kTerminal);
    for (int64_t b = 0; b < n; ++b) {
      const bool term = length[b] < horizon || Terminal(Mod(indices[b] + length[b] - 1));
      if (term) std::memcpy(out.terminal + b * t_item, terminal_one_, t_item);
      else std::memset(out.terminal + b * t_item, 0, t_item);
    }
  }
  if (out.indices)
    for (int64_t b = 0; b < n; ++b) out.indices[b] = static_cast<int32_t>(indices[b]);
  if (out.probabilities && options_.prioritized) {
    for (int64_t b = 0; b < n; ++b) {
      // Dopamine reads its leaf array at the int32 index, numpy-style (negatives wrap).
      int64_t i = static_cast<int32_t>(indices[b]);
      if (i < 0) i += padded_leaves_;
      out.probabilities[b] =
          (i >= 0 && i < padded_leaves_) ? static_cast<float>(tree_.Get(i)) : 0.0f;
    }
  }
  return Status::OK();
}

Status CircularBuffer::Gather(const int64_t* indices, int64_t n, const Outputs& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  return GatherLocked(indices, n, out);
}

Status CircularBuffer::SampleAndGather(int64_t n, const Outputs& out, int64_t* indices_out) {
  if (n < 0) return Error(Code::kInvalidArgument, "batch_size: expected >= 0, got ", n);
  std::lock_guard<std::mutex> lock(mu_);
  MEMOIRE_RETURN_IF_ERROR(SampleLocked(n, indices_out));
  return GatherLocked(indices_out, n, out);
}

Status CircularBuffer::SetPriorities(const int64_t* indices, const double* priorities, int64_t n) {
  if (!options_.prioritized)
    return Error(Code::kFailedPrecondition, "set_priority: the buffer is not prioritized");
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || indices[i] >= options_.capacity)
      return Error(Code::kOutOfRange, "indices: expected values in [0, ", options_.capacity,
                   "), got ", indices[i])
          .With("index", indices[i])
          .With("bound", options_.capacity);
    MEMOIRE_RETURN_IF_ERROR(CheckPriority(priorities[i]));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) SetLeaf(indices[i], priorities[i]);
  return Status::OK();
}

Status CircularBuffer::GetPriorities(const int64_t* indices, int64_t n, double* out) const {
  if (!options_.prioritized)
    return Error(Code::kFailedPrecondition, "get_priority: the buffer is not prioritized");
  for (int64_t i = 0; i < n; ++i)
    if (indices[i] < -padded_leaves_ || indices[i] >= padded_leaves_)
      return Error(Code::kOutOfRange, "indices: expected values in [", -padded_leaves_, ", ",
                   padded_leaves_, ") (the padded leaves), got ", indices[i])
          .With("index", indices[i])
          .With("bound", padded_leaves_);
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = indices[i] < 0 ? indices[i] + padded_leaves_ : indices[i];
    out[i] = tree_.Get(j);
  }
  return Status::OK();
}

double CircularBuffer::max_recorded_priority() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tree_.max_recorded();
}

void CircularBuffer::set_max_recorded_priority(double v) {
  std::lock_guard<std::mutex> lock(mu_);
  tree_.set_max_recorded(v);
}

double CircularBuffer::total_priority() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tree_.Total();
}

Status CircularBuffer::SampleTree(int64_t n, bool stratified, int64_t* out) {
  if (!options_.prioritized)
    return Error(Code::kFailedPrecondition, "sample: the buffer is not prioritized");
  std::lock_guard<std::mutex> lock(mu_);
  return tree_.Sample(rng_, n, stratified, out);
}

std::vector<int64_t> CircularBuffer::EpisodeEnds() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> ends;
  for (int64_t i = 0; i < options_.capacity; ++i)
    if (episode_end_[i]) ends.push_back(i);
  return ends;
}

Status CircularBuffer::SetEpisodeEnds(const std::vector<int64_t>& slots) {
  for (int64_t s : slots)
    if (s < 0 || s >= options_.capacity)
      return Error(Code::kOutOfRange, "episode_end_indices: expected slots in [0, ",
                   options_.capacity, "), got ", s)
          .With("index", s)
          .With("bound", options_.capacity);
  std::lock_guard<std::mutex> lock(mu_);
  episode_end_.Clear();
  for (int64_t s : slots) episode_end_[s] = 1;
  return Status::OK();
}

Status CircularBuffer::CheckRestore(int64_t add_count, const std::vector<int64_t>& ends,
                                    const double* leaves, double max_recorded) const {
  if (add_count < 0 || add_count > kMaxAddCount)
    return Error(Code::kInvalidArgument, "add_count: expected 0 <= add_count <= 2**62, got ",
                 add_count);
  for (int64_t s : ends)
    if (s < 0 || s >= options_.capacity)
      return Error(Code::kInvalidArgument, "episode_end_indices: expected slots in [0, ",
                   options_.capacity, "), got ", s);
  if (options_.prioritized) {
    if (leaves == nullptr) return Error(Code::kInvalidArgument, "priorities: required");
    for (int64_t i = 0; i < options_.capacity; ++i)
      if (!(leaves[i] >= 0.0) || std::isinf(leaves[i]))
        return Error(Code::kInvalidArgument, "priorities: expected finite values >= 0, got ",
                     leaves[i], " at slot ", i);
    if (std::isnan(max_recorded))
      return Error(Code::kInvalidArgument, "max_recorded_priority: expected a number, got nan");
  }
  return Status::OK();
}

void CircularBuffer::RestoreStateLocked(int64_t add_count, const std::vector<int64_t>& ends,
                                        const double* leaves, double max_recorded) {
  add_count_ = add_count;
  episode_end_.Clear();
  for (int64_t s : ends) episode_end_[s] = 1;
  if (options_.prioritized) {
    tree_.Clear();
    for (int64_t i = 0; i < options_.capacity; ++i)
      if (leaves[i] != 0.0) tree_.Set(i, leaves[i]);
    tree_.set_max_recorded(max_recorded);
  }
}

Status CircularBuffer::Restore(const void* const* columns, int64_t add_count,
                               const std::vector<int64_t>& ends, const double* leaves,
                               double max_recorded) {
  MEMOIRE_RETURN_IF_ERROR(CheckRestore(add_count, ends, leaves, max_recorded));
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t f = 0; f < schema().size(); ++f)
    if (columns[f])
      std::memcpy(columns_.data(static_cast<int>(f)), columns[f],
                  columns_.row_bytes(static_cast<int>(f)) * static_cast<size_t>(options_.capacity));
  RestoreStateLocked(add_count, ends, leaves, max_recorded);
  return Status::OK();
}

Status CircularBuffer::RestoreFrom(CircularBuffer* staging, int64_t add_count,
                                   const std::vector<int64_t>& ends, const double* leaves,
                                   double max_recorded) {
  if (staging == this)
    return Error(Code::kInvalidArgument, "restore_from: staging must be another buffer");
  if (staging->schema() != schema() || staging->capacity() != capacity())
    return Error(Code::kInvalidArgument,
                 "restore_from: staging must have this buffer's fields and capacity");
  MEMOIRE_RETURN_IF_ERROR(CheckRestore(add_count, ends, leaves, max_recorded));
  std::scoped_lock lock(mu_, staging->mu_);
  columns_.TakeContents(staging->columns_);
  RestoreStateLocked(add_count, ends, leaves, max_recorded);
  return Status::OK();
}

void CircularBuffer::Seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  rng_.Seed(seed);
}

}  // namespace memoire
