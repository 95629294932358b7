#include "core/batch_layout.h"

namespace memoire {

namespace {

BatchPart Part(DType dtype, std::vector<int64_t> shape, bool none) {
  BatchPart p;
  p.dtype = dtype;
  p.shape = std::move(shape);
  p.none = none;
  size_t b = none ? 0 : ItemSize(dtype);
  for (int64_t d : p.shape) b *= static_cast<size_t>(d);
  p.bytes = b;
  return p;
}

size_t RoundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

}  // namespace

BatchLayout MemoryBatchLayout(const Schema& schema, int64_t n, int frame_stack,
                              const uint8_t* flags, bool totals) {
  constexpr int F = ReplayMemory::kNumFields;
  BatchLayout l;
  for (int side = 0; side < 2; ++side)
    for (int f = 0; f < F; ++f) {
      const Field& fd = schema.field(f);
      std::vector<int64_t> shape{n, frame_stack};
      shape.insert(shape.end(), fd.shape.begin(), fd.shape.end());
      l.parts.push_back(Part(fd.dtype, std::move(shape), !flags[side * F + f]));
    }
  l.parts.push_back(Part(DType::kFloat32, {n}, false));  // weight
  l.parts.push_back(Part(DType::kFloat64, {n}, false));  // prob
  l.parts.push_back(Part(DType::kBool, {n}, false));     // done
  l.parts.push_back(Part(DType::kInt64, {n}, false));    // id
  if (totals) {
    l.parts.push_back(Part(DType::kInt64, {1}, false));    // num_sampleable
    l.parts.push_back(Part(DType::kFloat64, {1}, false));  // total_weight
  }
  size_t end = 0;
  for (BatchPart& p : l.parts) {
    p.offset = end;
    end += RoundUp(p.bytes, BatchLayout::kPartAlign);
  }
  l.slot_bytes = RoundUp(end == 0 ? 1 : end, BatchLayout::kSlotAlign);
  return l;
}

void BatchLayout::PartsAt(uint8_t* base, uint8_t** data) const {
  for (size_t p = 0; p < parts.size(); ++p)
    data[p] = parts[p].none ? nullptr : base + parts[p].offset;
}

void BatchLayout::Point(uint8_t* const* data, ReplayMemory::SampleOut* out) const {
  constexpr int F = ReplayMemory::kNumFields;
  for (int f = 0; f < F; ++f) {
    out->prev[f] = parts[f].none ? nullptr : data[f];
    out->next[f] = parts[F + f].none ? nullptr : data[F + f];
  }
  out->weight = reinterpret_cast<float*>(data[2 * F]);
  out->prob = reinterpret_cast<double*>(data[2 * F + 1]);
  out->done = data[2 * F + 2];
  out->id = reinterpret_cast<int64_t*>(data[2 * F + 3]);
  if (parts.size() > static_cast<size_t>(2 * F + 4)) {
    out->num_sampleable = reinterpret_cast<int64_t*>(data[2 * F + 4]);
    out->total_weight = reinterpret_cast<double*>(data[2 * F + 5]);
  }
}

}  // namespace memoire
