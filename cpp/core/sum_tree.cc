#include "core/sum_tree.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

namespace memoire {

namespace {

// Writes v into *node unless it already holds those bits: an unchanged node's page stays
// untouched (uncommitted when it was never written), and -0.0 and NaN payloads copy exactly.
inline void Store(double* node, double v) {
  if (std::memcmp(node, &v, sizeof v) != 0) *node = v;
}

}  // namespace

SumTree::SumTree(int64_t capacity, Rule rule) : capacity_(capacity), rule_(rule) {
  leaf0_ = 1;
  while (leaf0_ < std::max<int64_t>(capacity, 1)) leaf0_ <<= 1;
  nodes_ = ReservedArray<double>(static_cast<size_t>(2 * leaf0_));
  if (!nodes_.allocated()) throw std::bad_alloc();
}

void SumTree::Set(int64_t index, double priority) {
  if (rule_ == Rule::kAddDeltas) return AddDeltas(&index, &priority, 1);
  double* n = nodes_.data();
  int64_t i = leaf0_ + index;
  n[i] = priority;
  if (priority > max_recorded_) max_recorded_ = priority;
  for (i >>= 1; i >= 1; i >>= 1) n[i] = n[2 * i] + n[2 * i + 1];
}

void SumTree::SetMany(const int64_t* indices, const double* priorities, int64_t k) {
  if (k <= 0) return;
  if (rule_ == Rule::kAddDeltas) return AddDeltas(indices, priorities, k);
  SetExact(indices, priorities, k);
}

void SumTree::SetExact(const int64_t* indices, const double* priorities, int64_t k) {
  // Node numbers of the touched leaves, ascending and unique: then each level's parents are
  // ascending too, and duplicates are adjacent.
  double* n = nodes_.data();
  std::vector<int64_t> level(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    n[leaf0_ + indices[j]] = priorities[j];
    if (priorities[j] > max_recorded_) max_recorded_ = priorities[j];
    level[j] = leaf0_ + indices[j];
  }
  if (!std::is_sorted(level.begin(), level.end())) std::sort(level.begin(), level.end());
  level.erase(std::unique(level.begin(), level.end()), level.end());
  while (level.front() > 1) {
    size_t m = 0;
    for (size_t j = 0; j < level.size(); ++j) {
      const int64_t parent = level[j] >> 1;
      if (m > 0 && level[m - 1] == parent) continue;
      n[parent] = n[2 * parent] + n[2 * parent + 1];
      level[m++] = parent;
    }
    level.resize(m);
  }
}

void SumTree::AddDeltas(const int64_t* indices, const double* priorities, int64_t k) {
  // Dopamine: deltas against the current leaves, de-duplicated keeping the first occurrence
  // and sorted by index (numpy.unique), then added level by level (numpy.add.at). A node only
  // ever receives the deltas of its own leaves, in ascending leaf order, so adding each delta
  // from its leaf to the root in that order rounds the same.
  double* n = nodes_.data();
  std::vector<std::pair<int64_t, double>> d;
  d.reserve(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    d.emplace_back(indices[j], priorities[j] - n[leaf0_ + indices[j]]);
    if (priorities[j] > max_recorded_) max_recorded_ = priorities[j];
  }
  std::stable_sort(d.begin(), d.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  d.erase(std::unique(d.begin(), d.end(),
                      [](const auto& a, const auto& b) { return a.first == b.first; }),
          d.end());
  for (const auto& [index, delta] : d)
    for (int64_t i = leaf0_ + index; i >= 1; i >>= 1) n[i] += delta;
}

int64_t SumTree::Find(double mass) const {
  const double* n = nodes_.data();
  if (!(n[1] > 0.0)) return -1;
  if (mass < 0.0) mass = 0.0;
  int64_t i = 1;
  while (i < leaf0_) {
    const double left = n[2 * i];
    const double right = n[2 * i + 1];
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

int64_t SumTree::Descend(double target) const {
  const double* n = nodes_.data();
  int64_t i = 1;
  while (i < leaf0_) {
    const double left = n[2 * i];
    if (target < left) {
      i = 2 * i;
    } else {
      target -= left;
      i = 2 * i + 1;
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

void SumTree::SetHeap(const double* nodes) {
  double* n = nodes_.data() + 1;
  for (int64_t i = 0; i < heap_size(); ++i) Store(n + i, nodes[i]);
}

void SumTree::Rebuild() {
  double* n = nodes_.data();
  for (int64_t i = leaf0_ - 1; i >= 1; --i) Store(n + i, n[2 * i] + n[2 * i + 1]);
}

void SumTree::Clear() {
  nodes_.Clear();
  max_recorded_ = 1.0;
}

}  // namespace memoire
