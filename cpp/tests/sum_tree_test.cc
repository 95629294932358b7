// SumTree: totals and prefix search for capacities that are not powers of two, no zero leaf
// ever found, stratified sampling in proportion to priority, and Rebuild.
#include "core/sum_tree.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <unistd.h>
#endif

#include "core/rng.h"
#include "tests/testing.h"

using memoire::Rng;
using memoire::SumTree;

namespace {

// The leaf a linear scan finds for `mass`: the first i with mass < prefix(<= i), skipping zeros.
int64_t LinearFind(const std::vector<double>& p, double mass) {
  double acc = 0;
  int64_t last_positive = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    last_positive = static_cast<int64_t>(i);
    acc += p[i];
    if (mass < acc) return static_cast<int64_t>(i);
  }
  return last_positive;
}

}  // namespace

TEST(AnyCapacityTotalsAndFind) {
  for (int64_t cap : {1, 2, 3, 5, 7, 13, 100, 1000}) {
    SumTree t(cap);
    CHECK(t.capacity() == cap);
    CHECK(t.Total() == 0.0);
    CHECK(t.Find(0.5) == -1);
    std::vector<double> p(cap, 0.0);
    double total = 0;
    for (int64_t i = 0; i < cap; ++i) {
      p[i] = (i % 3 == 1) ? 0.0 : 0.5 + static_cast<double>(i % 7);  // integers/halves: exact
      t.Set(i, p[i]);
      total += p[i];
    }
    CHECK(t.Total() == total);
    for (int64_t i = 0; i < cap; ++i) CHECK(t.Get(i) == p[i]);
    // Every boundary and midpoint agrees with a linear scan.
    double acc = 0;
    for (int64_t i = 0; i < cap; ++i) {
      if (p[i] == 0) continue;
      CHECK(t.Find(acc) == i);
      CHECK(t.Find(acc + p[i] / 2) == i);
      CHECK(t.Find(acc) == LinearFind(p, acc));
      acc += p[i];
    }
    // Past the end and below zero: clamped onto a positive leaf.
    CHECK(t.Find(total) == LinearFind(p, total));
    CHECK(t.Find(total * 2) == LinearFind(p, total));
    CHECK(t.Find(-1.0) == LinearFind(p, 0.0));
  }
}

TEST(CapacityOne) {
  SumTree t(1);
  t.Set(0, 2.5);
  CHECK(t.Total() == 2.5);
  CHECK(t.Find(0.0) == 0 && t.Find(2.4) == 0 && t.Find(100.0) == 0);
  t.Set(0, 0.0);
  CHECK(t.Total() == 0.0 && t.Find(0.0) == -1);
  Rng rng(1);
  int64_t out[4];
  CHECK(!t.Sample(rng, 4, true, out).ok());
}

TEST(FindNeverReturnsAZeroLeaf) {
  // Priorities that do not add up exactly, with zeros on both sides of positive leaves, and
  // masses at and past every boundary.
  for (int64_t cap : {3, 13, 1000}) {
    SumTree t(cap);
    Rng rng(cap);
    for (int round = 0; round < 20; ++round) {
      for (int64_t i = 0; i < cap; ++i)
        t.Set(i, rng.Uniform() < 0.6 ? 0.0 : rng.Uniform() * 1e-3 + 1e-7 * rng.Uniform());
      if (t.Total() == 0) t.Set(cap / 2, 0.1);
      const double total = t.Total();
      for (int k = 0; k <= 2000; ++k) {
        const double mass = total * k / 2000.0;
        const int64_t i = t.Find(mass);
        CHECK(i >= 0 && i < cap);
        if (i >= 0 && i < cap) CHECK(t.Get(i) > 0);
        const double nudged = std::nextafter(mass, 2 * total + 1);
        const int64_t j = t.Find(nudged);
        CHECK(j >= 0 && j < cap && t.Get(j) > 0);
      }
    }
  }
}

TEST(StratifiedSampleFollowsPriorities) {
  const int64_t cap = 13;
  SumTree t(cap);
  std::vector<double> p(cap);
  double total = 0;
  for (int64_t i = 0; i < cap; ++i) {
    p[i] = (i == 4) ? 0.0 : 1.0 + static_cast<double>(i);
    t.Set(i, p[i]);
    total += p[i];
  }
  Rng rng(42);
  const int64_t batch = 64, rounds = 2000;
  std::vector<int64_t> counts(cap, 0), out(batch);
  for (int r = 0; r < rounds; ++r) {
    CHECK(t.Sample(rng, batch, /*stratified=*/true, out.data()).ok());
    // Stratified: draws come in leaf order (slice k lies before slice k+1).
    for (int64_t k = 1; k < batch; ++k) CHECK(out[k - 1] <= out[k]);
    for (int64_t i : out) ++counts[i];
  }
  CHECK(counts[4] == 0);
  const double n = static_cast<double>(batch * rounds);
  double chi2 = 0;
  for (int64_t i = 0; i < cap; ++i) {
    if (p[i] == 0) continue;
    const double e = n * p[i] / total;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  CHECK(chi2 < 32.9);  // 11 degrees of freedom: the 99.95% quantile
  // Plain (unstratified) draws follow the same distribution.
  std::fill(counts.begin(), counts.end(), 0);
  for (int r = 0; r < rounds; ++r) {
    CHECK(t.Sample(rng, batch, /*stratified=*/false, out.data()).ok());
    for (int64_t i : out) ++counts[i];
  }
  chi2 = 0;
  for (int64_t i = 0; i < cap; ++i) {
    if (p[i] == 0) continue;
    const double e = n * p[i] / total;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  CHECK(counts[4] == 0);
  CHECK(chi2 < 32.9);
}

TEST(SameSeedSameSample) {
  SumTree t(100);
  for (int64_t i = 0; i < 100; ++i) t.Set(i, 1.0 + i % 5);
  Rng a(7), b(7), c(8);
  std::vector<int64_t> x(32), y(32), z(32);
  CHECK(t.Sample(a, 32, true, x.data()).ok());
  CHECK(t.Sample(b, 32, true, y.data()).ok());
  CHECK(t.Sample(c, 32, true, z.data()).ok());
  CHECK(x == y);
  CHECK(x != z);
}

TEST(RebuildRemovesDrift) {
  const int64_t cap = 1000;
  SumTree t(cap);
  Rng rng(3);
  std::vector<double> p(cap, 0.0);
  for (int k = 0; k < 200000; ++k) {
    const int64_t i = static_cast<int64_t>(rng.Below(cap));
    p[i] = rng.Uniform() * 1e6 + rng.Uniform() * 1e-6;
    t.Set(i, p[i]);
  }
  for (int64_t i = 0; i < cap; ++i) t.Set(i, 0.0);
  t.Set(17, 1e-300);  // tiny next to what was there
  t.Rebuild();
  CHECK(t.Total() == 1e-300);
  CHECK(t.Find(0.0) == 17 && t.Find(1.0) == 17);
  for (int64_t i = 0; i < cap; ++i) p[i] = static_cast<double>(i % 4);
  for (int64_t i = 0; i < cap; ++i) t.Set(i, p[i]);
  t.Rebuild();
  double total = 0;
  for (double v : p) total += v;
  CHECK(t.Total() == total);
}

TEST(MaxRecordedAndClear) {
  SumTree t(5);
  CHECK(t.max_recorded() == 1.0);
  t.Set(2, 3.5);
  t.Set(2, 0.5);
  CHECK(t.max_recorded() == 3.5);
  t.Clear();
  CHECK(t.Total() == 0.0 && t.Get(2) == 0.0 && t.max_recorded() == 1.0);
}

// Resident bytes of this process (Linux; -1 elsewhere).
long long ResidentBytes() {
#if defined(__linux__)
  long long pages = 0, resident = -1;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lld %lld", &pages, &resident) != 2) resident = -1;
    std::fclose(f);
  }
  return resident < 0 ? -1 : resident * sysconf(_SC_PAGESIZE);
#else
  return -1;
#endif
}

// A tree takes resident memory only where leaves were set (and their ancestors), and Clear
// gives it back; the nodes still read as an all-zero tree.
TEST(MemoryFollowsTheSetLeaves) {
  const int64_t cap = int64_t{1} << 22;  // 64 MiB of nodes if committed
  const long long before = ResidentBytes();
  SumTree t(cap);
  const long long empty = ResidentBytes();
  CHECK(t.Total() == 0.0 && t.Find(0.3) == -1 && t.Get(cap - 1) == 0.0);
  for (int64_t i = 0; i < 1000; ++i) t.Set(i, 1.0);
  const long long some = ResidentBytes();
  CHECK(t.Total() == 1000.0 && t.Find(999.5) == 999);
  if (before >= 0) {
    CHECK(empty - before < (4 << 20));
    CHECK(some - before < (16 << 20));  // a few pages per level (2 MiB huge pages at most)
  }
  for (int64_t i = 0; i < cap; i += 4096) t.Set(i, 2.0);  // 1,024 leaves across the tree
  const long long spread = ResidentBytes();
  t.Clear();
  const long long cleared = ResidentBytes();
  if (before >= 0) CHECK(spread - cleared > (4 << 20));
  CHECK(t.Total() == 0.0 && t.Get(0) == 0.0 && t.Get(4096) == 0.0 && t.max_recorded() == 1.0);
  t.Set(5, 0.25);
  CHECK(t.Total() == 0.25 && t.Find(0.1) == 5);
}

// SetHeap and Rebuild write only the nodes that change, and copy every bit of those that do
// (a -0.0 stays -0.0, as Dopamine's checkpointed nodes may hold).
TEST(SetHeapAndRebuildKeepEveryBit) {
  for (SumTree::Rule rule : {SumTree::Rule::kExactSums, SumTree::Rule::kAddDeltas}) {
    SumTree src(6, rule);
    src.Set(1, 0.5);
    src.Set(4, 0.25);
    std::vector<double> heap(src.heap(), src.heap() + src.heap_size());
    heap[heap.size() - 1] = -0.0;  // the last padding leaf
    SumTree dst(6, rule);
    dst.Set(3, 7.0);  // overwritten by SetHeap
    dst.SetHeap(heap.data());
    CHECK(std::memcmp(dst.heap(), heap.data(), heap.size() * sizeof(double)) == 0);
    dst.Rebuild();
    CHECK(dst.Total() == 0.75 && dst.Get(3) == 0.0 && std::signbit(dst.Get(7)));
  }
}

TEST_MAIN()

// SetMany must leave every node (not only the total) exactly as the same Sets in order would:
// ascending runs, a ring wrap, unsorted indices with repeats, zeros, and capacity 1.
TEST(SetManyEqualsSetInOrder) {
  Rng rng(11);
  for (int64_t cap : {1, 2, 3, 7, 64, 100, 1000}) {
    SumTree a(cap), b(cap);
    for (int round = 0; round < 20; ++round) {
      const int64_t k = 1 + static_cast<int64_t>(rng.Uniform() * static_cast<double>(cap + 5));
      std::vector<int64_t> idx(k);
      std::vector<double> pri(k);
      const int64_t start = static_cast<int64_t>(rng.Uniform() * static_cast<double>(cap));
      for (int64_t j = 0; j < k; ++j) {
        // Even rounds: a contiguous run that wraps around the ring; odd rounds: any order,
        // repeats possible. A third of the priorities are zero (evictions).
        idx[j] = round % 2 == 0 ? (start + j) % cap
                                : static_cast<int64_t>(rng.Uniform() * static_cast<double>(cap));
        pri[j] = rng.Uniform() < 0.33 ? 0.0 : rng.Uniform() * 10.0 + 0.1;
      }
      for (int64_t j = 0; j < k; ++j) a.Set(idx[j], pri[j]);
      b.SetMany(idx.data(), pri.data(), k);
      for (int64_t i = 0; i < cap; ++i) CHECK(a.Get(i) == b.Get(i));
      CHECK(a.Total() == b.Total());
      CHECK(a.max_recorded() == b.max_recorded());
      for (int q = 0; q < 16; ++q) {
        const double mass = rng.Uniform() * a.Total();
        CHECK(a.Find(mass) == b.Find(mass));
      }
    }
    b.SetMany(nullptr, nullptr, 0);  // k == 0 changes nothing
    CHECK(a.Total() == b.Total());
  }
}

namespace {

// Dopamine JAX's SumTree, transcribed: a 0-based heap of 2P - 1 nodes; set() takes deltas
// against the leaves, keeps each index's first occurrence (numpy.unique, sorted), and adds them
// level by level (numpy.add.at); query() descends left while target < the left sum.
struct DopamineJaxTree {
  explicit DopamineJaxTree(int64_t capacity) {
    depth = 1;
    while ((int64_t{1} << (depth - 1)) < capacity) ++depth;
    first_leaf = (int64_t{1} << (depth - 1)) - 1;
    nodes.assign((int64_t{1} << depth) - 1, 0.0);
  }
  void Set(const std::vector<int64_t>& idx, const std::vector<double>& val) {
    std::vector<std::pair<int64_t, double>> d;
    for (size_t j = 0; j < idx.size(); ++j)
      d.emplace_back(first_leaf + idx[j], val[j] - nodes[first_leaf + idx[j]]);
    std::vector<std::pair<int64_t, double>> unique;
    for (size_t j = 0; j < d.size(); ++j) {
      bool seen = false;
      for (const auto& u : unique) seen = seen || u.first == d[j].first;
      if (!seen) unique.push_back(d[j]);
    }
    std::sort(unique.begin(), unique.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (int level = 0; level < depth - 1; ++level)
      for (auto& [node, delta] : unique) {
        nodes[node] += delta;
        node = (node - 1) / 2;
      }
    for (auto& [node, delta] : unique) nodes[node] += delta;
  }
  int64_t Query(double target) const {
    int64_t node = 0;
    while (node < first_leaf) {
      const int64_t left = 2 * node + 1;
      if (target < nodes[left]) {
        node = left;
      } else {
        target -= nodes[left];
        node = left + 1;
      }
    }
    return node - first_leaf;
  }
  int depth;
  int64_t first_leaf;
  std::vector<double> nodes;
};

}  // namespace

// The kAddDeltas rule leaves every node bit-identical to Dopamine JAX's tree (heap layout, drift
// of accumulated deltas, first value kept for a repeated index), and Descend is its query.
TEST(AddDeltasIsDopamineJaxBitForBit) {
  Rng rng(5);
  for (int64_t cap : {1, 2, 3, 8, 100, 1024}) {
    SumTree t(cap, SumTree::Rule::kAddDeltas);
    DopamineJaxTree ref(cap);
    CHECK(t.heap_size() == static_cast<int64_t>(ref.nodes.size()));
    for (int round = 0; round < 200; ++round) {
      const int64_t k = 1 + static_cast<int64_t>(rng.Uniform() * 6.0);
      std::vector<int64_t> idx(k);
      std::vector<double> val(k);
      for (int64_t j = 0; j < k; ++j) {
        idx[j] = static_cast<int64_t>(rng.Uniform() * static_cast<double>(cap));
        val[j] = rng.Uniform() < 0.2 ? 0.0 : rng.Uniform() * 3.0;  // not exact in binary
      }
      if (k == 1) t.Set(idx[0], val[0]);
      else t.SetMany(idx.data(), val.data(), k);
      ref.Set(idx, val);
      for (int64_t i = 0; i < t.heap_size(); ++i) CHECK(t.heap()[i] == ref.nodes[i]);
      if (t.Total() > 0.0) {
        const double target = rng.Uniform() * t.Total();
        CHECK(t.Descend(target) == ref.Query(target));
      }
    }
    // SetHeap round-trips the layout.
    SumTree copy(cap, SumTree::Rule::kAddDeltas);
    copy.SetHeap(t.heap());
    for (int64_t i = 0; i < cap; ++i) CHECK(copy.Get(i) == t.Get(i));
    CHECK(copy.Total() == t.Total());
  }
}
