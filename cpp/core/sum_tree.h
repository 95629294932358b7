// SumTree: priorities of `capacity` leaves in double precision with O(log n) set, sample and
// prefix search, for any capacity (leaves are padded to a power of two with zeros).
// Thread-compatible: the owner guards it.
//
// Cost: Set O(log n); Get O(1); Total O(1); Find O(log n); SetMany O(k + touched nodes)
// (plus O(k log k) when the indices are not ascending).
// Numerics: internal nodes are sums of doubles, so after very many updates a parent can drift
// from the exact sum of its children by rounding; Find never returns a zero-priority leaf
// (it steers away from empty subtrees) and Rebuild() recomputes every node exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "core/status.h"

namespace memoire {

class SumTree {
 public:
  explicit SumTree(int64_t capacity = 0);

  int64_t capacity() const { return capacity_; }
  // Priority must be finite and >= 0 (checked by callers that take user input).
  void Set(int64_t index, double priority);
  // Sets leaves indices[j] = priorities[j] for j < k, then recomputes each touched parent once,
  // level by level. The tree ends bit-identical to k calls of Set in order (a repeated index
  // keeps its last priority). Indices must be in [0, capacity).
  void SetMany(const int64_t* indices, const double* priorities, int64_t k);
  double Get(int64_t index) const { return nodes_[leaf0_ + index]; }
  double Total() const { return nodes_[1]; }
  // The largest priority ever Set (Dopamine's max_recorded_priority); starts at `initial`.
  double max_recorded() const { return max_recorded_; }
  void set_max_recorded(double v) { max_recorded_ = v; }

  // The leaf i whose cumulative range [sum(<i), sum(<=i)) contains `mass` (clamped into
  // [0, Total())). Returns -1 when Total() == 0.
  int64_t Find(double mass) const;

  // `n` leaves drawn with probability proportional to priority into out[0..n). With
  // `stratified`, draw k falls in the k-th of n equal slices of the total mass.
  // Fails with kFailedPrecondition when the total is zero.
  Status Sample(Rng& rng, int64_t n, bool stratified, int64_t* out) const;

  // Recomputes every internal node from the leaves (removes accumulated rounding).
  void Rebuild();
  void Clear();

 private:
  int64_t capacity_;
  int64_t leaf0_;              // index of leaf 0 in nodes_ (a power of two)
  std::vector<double> nodes_;  // 1-based heap: nodes_[1] is the root
  double max_recorded_ = 1.0;
};

}  // namespace memoire
