// Gather kernels: both stack layouts against a plain element-by-element reference, for element
// sizes 1/2/4/8 (and an odd one), stacks 1..5, odd row lengths and an unaligned output.
#include "core/gather.h"

#include <cstring>
#include <vector>

#include "core/rng.h"
#include "tests/testing.h"

using namespace memoire;

namespace {

std::vector<uint8_t> RandomColumn(Rng& rng, size_t bytes) {
  std::vector<uint8_t> c(bytes);
  for (auto& b : c) b = static_cast<uint8_t>(rng.Next());
  return c;
}

}  // namespace

TEST(GatherRowsCopiesRows) {
  Rng rng(1);
  const size_t row_bytes = 13;
  const int64_t cap = 7;
  auto col = RandomColumn(rng, row_bytes * cap);
  const int64_t slots[] = {6, 0, 3, 3, 5};
  std::vector<uint8_t> out(5 * row_bytes, 0xAB);
  GatherRows(col.data(), row_bytes, slots, 5, out.data());
  for (int b = 0; b < 5; ++b)
    CHECK(std::memcmp(out.data() + b * row_bytes, col.data() + slots[b] * row_bytes,
                      row_bytes) == 0);
  GatherRows(col.data(), row_bytes, slots, 0, out.data());  // n = 0 writes nothing
}

TEST(BothLayoutsAllElementSizesAndStacks) {
  Rng rng(2);
  for (size_t elem : {1, 2, 3, 4, 8}) {
    for (int64_t row_elems : {1, 5, 7056 / 8, 33}) {
      const int64_t cap = 11;
      const size_t row_bytes = elem * row_elems;
      auto col = RandomColumn(rng, row_bytes * cap);
      for (int stack = 1; stack <= 5; ++stack) {
        const int64_t n = 6;
        std::vector<int64_t> slots(n * stack);
        for (auto& s : slots) s = static_cast<int64_t>(rng.Below(cap));
        // Contiguous layout [n, stack, row].
        std::vector<uint8_t> out(n * stack * row_bytes + 1, 0xCD);
        GatherRows(col.data(), row_bytes, slots.data(), n * stack, out.data());
        for (int64_t b = 0; b < n; ++b)
          for (int k = 0; k < stack; ++k)
            CHECK(std::memcmp(out.data() + (b * stack + k) * row_bytes,
                              col.data() + slots[b * stack + k] * row_bytes, row_bytes) == 0);
        CHECK(out.back() == 0xCD);  // nothing past the end
        // Channel-last layout [n, row, stack], aligned and at an odd offset.
        for (size_t offset : {size_t{0}, size_t{1}}) {
          std::vector<uint8_t> cl(offset + n * stack * row_bytes + 1, 0xEF);
          GatherStackChannelLast(col.data(), elem, row_elems, slots.data(), n, stack,
                                 cl.data() + offset);
          bool same = true;
          for (int64_t b = 0; b < n; ++b)
            for (int64_t e = 0; e < row_elems; ++e)
              for (int k = 0; k < stack; ++k) {
                const uint8_t* want = col.data() + slots[b * stack + k] * row_bytes + e * elem;
                const uint8_t* got =
                    cl.data() + offset + ((b * row_elems + e) * stack + k) * elem;
                same &= std::memcmp(want, got, elem) == 0;
              }
          CHECK(same);
          CHECK(cl.back() == 0xEF);
          if (offset) CHECK(cl[0] == 0xEF);
        }
      }
    }
  }
}

TEST(AtariStackOfFour) {
  // 84x84 uint8 frames, stacks of 4 consecutive slots that wrap around a ring of 7.
  Rng rng(3);
  const int64_t elems = 84 * 84, cap = 7, n = 5, stack = 4;
  auto col = RandomColumn(rng, elems * cap);
  std::vector<int64_t> slots(n * stack);
  for (int64_t b = 0; b < n; ++b)
    for (int k = 0; k < stack; ++k) slots[b * stack + k] = (b + 4 + k) % cap;
  std::vector<uint8_t> cl(n * elems * stack), flat(n * elems * stack);
  GatherStackChannelLast(col.data(), 1, elems, slots.data(), n, stack, cl.data());
  GatherRows(col.data(), elems, slots.data(), n * stack, flat.data());
  bool same = true;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t e = 0; e < elems; ++e)
      for (int k = 0; k < stack; ++k)
        same &= cl[(b * elems + e) * stack + k] == flat[(b * stack + k) * elems + e];
  CHECK(same);
}

TEST(LargeStackFallsBackCorrectly) {
  Rng rng(4);
  const int64_t elems = 3, cap = 100, n = 2, stack = 70;  // more than the 64 row pointers
  auto col = RandomColumn(rng, elems * 4 * cap);
  std::vector<int64_t> slots(n * stack);
  for (auto& s : slots) s = static_cast<int64_t>(rng.Below(cap));
  std::vector<uint32_t> out(n * elems * stack);
  GatherStackChannelLast(col.data(), 4, elems, slots.data(), n, stack,
                         reinterpret_cast<uint8_t*>(out.data()));
  const uint32_t* c = reinterpret_cast<const uint32_t*>(col.data());
  bool same = true;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t e = 0; e < elems; ++e)
      for (int k = 0; k < stack; ++k)
        same &= out[(b * elems + e) * stack + k] == c[slots[b * stack + k] * elems + e];
  CHECK(same);
}

TEST_MAIN()
