// SumTree: priorities of `capacity` leaves in double precision with O(log n) set, sample and
// prefix search, for any capacity. Thread-compatible: the owner guards it.
//
// Layout: leaves are padded with zeros to P = the next power of two >= capacity, and the 2P - 1
// nodes are one heap, root first, the children of node i at 2i + 1 and 2i + 2 (Dopamine JAX's
// SumTree layout; its level-by-level TF layout is the same array cut at 1, 2, 4, ... nodes).
// heap() exposes it for checkpoints.
//
// Update rule (chosen at construction), the one difference between the trees memoire mirrors:
//  - kExactSums: after a leaf changes, each parent is recomputed as the sum of its children, so
//    inner nodes never drift (memoire's own rule, used by CircularBuffer).
//  - kAddDeltas: Dopamine JAX's SumTree.set, bit for bit: the deltas (new - old leaf) of one
//    call are de-duplicated keeping each index's first value, then added to the leaf and every
//    parent, in ascending index order. Inner sums accumulate rounding as Dopamine's do, so
//    TransitionStore's probabilities and checkpointed nodes match Dopamine's exactly.
//
// Cost: Set O(log n); Get O(1); Total O(1); Find/Descend O(log n); SetMany O(k log k + k log n)
// (kExactSums: O(k + touched nodes) when the indices are ascending).
// Numerics: Find never returns a zero-priority leaf (it steers away from empty subtrees);
// Descend is Dopamine's plain descent, which drift can steer onto one. Rebuild() recomputes
// every inner node exactly.
// Memory: the nodes are a ReservedArray (reserved.h), so a tree costs resident memory only for
// the pages its set leaves and their ancestors touch: leaves filled in order commit a prefix of
// each level. Untouched nodes read as zero, which is what an empty subtree holds. Clear, Rebuild
// and SetHeap write only nodes whose value changes. Construction throws std::bad_alloc when the
// nodes cannot be reserved.
#pragma once

#include <cstdint>

#include "core/reserved.h"
#include "core/rng.h"
#include "core/status.h"

namespace memoire {

class SumTree {
 public:
  enum class Rule { kExactSums, kAddDeltas };

  explicit SumTree(int64_t capacity = 0, Rule rule = Rule::kExactSums);

  int64_t capacity() const { return capacity_; }
  int64_t padded_leaves() const { return leaf0_; }
  Rule rule() const { return rule_; }
  // Priority must be finite and >= 0 (checked by callers that take user input).
  void Set(int64_t index, double priority);
  // Sets leaves indices[j] = priorities[j] for j < k in one update. kExactSums: the tree ends
  // bit-identical to k calls of Set in order (a repeated index keeps its last priority).
  // kAddDeltas: Dopamine's vectorised set (a repeated index keeps its first priority).
  // Indices must be in [0, padded_leaves()).
  void SetMany(const int64_t* indices, const double* priorities, int64_t k);
  double Get(int64_t index) const { return nodes_[static_cast<size_t>(leaf0_ + index)]; }
  double Total() const { return nodes_[1]; }
  // The largest priority ever Set (Dopamine's max_recorded_priority); starts at 1.
  double max_recorded() const { return max_recorded_; }
  void set_max_recorded(double v) { max_recorded_ = v; }

  // The leaf i whose cumulative range [sum(<i), sum(<=i)) contains `mass` (clamped into
  // [0, Total())), never a zero leaf. Returns -1 when Total() == 0.
  int64_t Find(double mass) const;
  // Dopamine's query for target in [0, Total()): left while target < the left sum, else right,
  // less the left sum. May end on a zero leaf when inner sums drifted (as Dopamine's does).
  int64_t Descend(double target) const;

  // `n` leaves drawn with probability proportional to priority into out[0..n) (with Find).
  // With `stratified`, draw k falls in the k-th of n equal slices of the total mass.
  // Fails with kFailedPrecondition when the total is zero.
  Status Sample(Rng& rng, int64_t n, bool stratified, int64_t* out) const;

  // The 2 * padded_leaves() - 1 nodes, root first (see Layout); SetHeap replaces them all
  // (the caller checked them: finite, >= 0).
  const double* heap() const { return nodes_.data() + 1; }
  int64_t heap_size() const { return 2 * leaf0_ - 1; }
  void SetHeap(const double* nodes);

  // Recomputes every internal node from the leaves (removes accumulated rounding).
  void Rebuild();
  // Every node 0 (their pages given back) and max_recorded 1.
  void Clear();

 private:
  void SetExact(const int64_t* indices, const double* priorities, int64_t k);
  void AddDeltas(const int64_t* indices, const double* priorities, int64_t k);

  int64_t capacity_;
  Rule rule_;
  int64_t leaf0_;              // node of leaf 0, 1-based (P, a power of two)
  ReservedArray<double> nodes_;  // nodes_[0] unused, nodes_[1] the root: heap() is nodes_ + 1
  double max_recorded_ = 1.0;
};

}  // namespace memoire
