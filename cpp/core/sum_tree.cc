#include "core/sum_tree.h"

#include <algorithm>

namespace memoire {

SumTree::SumTree(int64_t capacity) : capacity_(capacity) {
  leaf0_ = 1;
  while (leaf0_ < std::max<int64_t>(capacity, 1)) leaf0_ <<= 1;
  nodes_.assign(2 * leaf0_, 0.0);
}

void SumTree::Set(int64_t index, double priority) {
  int64_t i = leaf0_ + index;
  nodes_[i] = priority;
  if (priority > max_recorded_) max_recorded_ = priority;
  for (i >>= 1; i >= 1; i >>= 1) nodes_[i] = nodes_[2 * i] + nodes_[2 * i + 1];
}

int64_t SumTree::Find(double mass) const {
  if (!(nodes_[1] > 0.0)) return -1;
  if (mass < 0.0) mass = 0.0;
  int64_t i = 1;
  while (i < leaf0_) {
    const double left = nodes_[2 * i];
    const double right = nodes_[2 * i + 1];
    // Go right only when the mass is past the left subtree and the right one has mass;
    // rounding can make `mass` exceed the true sum, so an empty right subtree is never chosen.
    if ((mass >= left && right > 0.0) || !(left > 0.0)) {
      mass -= left;
      i = 2 * i + 1;
    } else {
      i = 2 * i;
    }
  }
  return i - leaf0_;
}

Status SumTree::Sample(Rng& rng, int64_t n, bool stratified, int64_t* out) const {
  const double total = nodes_[1];
  if (!(total > 0.0))
    return Error(Code::kFailedPrecondition, "no entry has a positive sampling priority");
  for (int64_t k = 0; k < n; ++k) {
    double u = rng.Uniform();
    double mass = stratified ? (static_cast<double>(k) + u) * total / static_cast<double>(n)
                             : u * total;
    out[k] = Find(mass);
  }
  return Status::OK();
}

void SumTree::Rebuild() {
  for (int64_t i = leaf0_ - 1; i >= 1; --i) nodes_[i] = nodes_[2 * i] + nodes_[2 * i + 1];
}

void SumTree::Clear() {
  std::fill(nodes_.begin(), nodes_.end(), 0.0);
  max_recorded_ = 1.0;
}

}  // namespace memoire
