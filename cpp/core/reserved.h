// Reserved memory: zero-filled blocks that take physical pages only where they are written.
//
// On Linux a block is a private anonymous mapping (MAP_NORESERVE): it reads as zeros, and the
// kernel commits a page on its first write, so a store sized for its capacity costs resident
// memory only for what it holds. Elsewhere calloc, which gets fresh zero pages from the OS for
// large blocks. Nothing here touches a page it does not write (no memset of the capacity).
// Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace memoire {

class ReservedBytes {
 public:
  ReservedBytes() = default;
  // `bytes` zero bytes (data() is null when the reservation failed). Blocks of 8 MiB or more
  // are 2 MiB aligned and asked to use transparent huge pages: samplers read rows at random
  // across the whole block, and with 4 KiB pages every row costs TLB misses.
  explicit ReservedBytes(size_t bytes) : bytes_(bytes) {
#if defined(__linux__)
    constexpr size_t kHuge = size_t{2} << 20;
    const bool large = bytes >= 4 * kHuge;
    const size_t align = large ? kHuge : 4096;
    const size_t size = ((bytes ? bytes : 1) + align - 1) / align * align;
    // Reserve size + align, then trim both ends to an aligned `size`.
    const size_t span = size + (large ? align : 0);
    void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return;
    const uintptr_t start = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (start + align - 1) / align * align;
    if (aligned > start) munmap(p, aligned - start);
    const uintptr_t end = aligned + size, span_end = start + span;
    if (span_end > end) munmap(reinterpret_cast<void*>(end), span_end - end);
#if defined(MADV_HUGEPAGE)
    if (large) madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
#endif
    data_ = reinterpret_cast<uint8_t*>(aligned);
    mapped_ = size;
#else
    data_ = static_cast<uint8_t*>(std::calloc(bytes ? bytes : 1, 1));
#endif
  }
  ReservedBytes(ReservedBytes&& o) noexcept { swap(o); }
  ReservedBytes& operator=(ReservedBytes&& o) noexcept {
    ReservedBytes(std::move(o)).swap(*this);
    return *this;
  }
  ReservedBytes(const ReservedBytes&) = delete;
  ReservedBytes& operator=(const ReservedBytes&) = delete;
  ~ReservedBytes() {
#if defined(__linux__)
    if (data_ && mapped_) munmap(data_, mapped_);
#endif
    if (data_ && !mapped_) std::free(data_);
  }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }
  void swap(ReservedBytes& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(mapped_, o.mapped_);
  }

  // Makes every byte zero again and, on Linux, gives the pages back (MADV_DONTNEED: a private
  // anonymous page reads as zeros afterwards), so a cleared block costs nothing resident.
  void Clear() {
    if (!data_) return;
#if defined(__linux__)
    if (mapped_ && madvise(data_, mapped_, MADV_DONTNEED) == 0) return;
#endif
    std::memset(data_, 0, bytes_);
  }

  // Makes this block hold `src`'s contents (same size) and leaves `src` reading zeros, both at
  // their addresses. On Linux the pages move (mremap): no copy and no second resident copy.
  // Elsewhere the bytes are copied.
  void TakeContents(ReservedBytes& src) {
#if defined(__linux__)
    if (data_ && src.data_ && mapped_ && mapped_ == src.mapped_) {
      // src's pages replace ours (ours are released), then fresh zero pages fill src's range.
      void* moved = mremap(src.data_, src.mapped_, mapped_, MREMAP_MAYMOVE | MREMAP_FIXED, data_);
      if (moved != MAP_FAILED) {
        void* fresh = mmap(src.data_, src.mapped_, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        if (fresh == MAP_FAILED) {  // the range is gone: src forgets it
          src.data_ = nullptr;
          src.mapped_ = 0;
        }
        return;
      }
    }
#endif
    if (!src.data_) {
      std::memset(data_, 0, bytes_);
      return;
    }
    std::memcpy(data_, src.data_, bytes_);
    std::memset(src.data_, 0, src.bytes_);
  }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_ = 0;  // bytes mapped at data_ (0: from calloc)
};

// n zero-initialised T (trivially copyable) in a ReservedBytes: a fixed-size array whose
// untouched elements cost no memory. For per-slot bookkeeping sized by a capacity.
template <typename T>
class ReservedArray {
 public:
  ReservedArray() = default;
  explicit ReservedArray(size_t n) : bytes_(n * sizeof(T)), n_(n) {}
  bool allocated() const { return bytes_.data() != nullptr; }
  size_t size() const { return n_; }
  T* data() { return reinterpret_cast<T*>(bytes_.data()); }
  const T* data() const { return reinterpret_cast<const T*>(bytes_.data()); }
  T* begin() { return data(); }
  const T* begin() const { return data(); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  // Every element zero again, its pages given back (ReservedBytes::Clear).
  void Clear() { bytes_.Clear(); }
  void swap(ReservedArray& o) noexcept {
    bytes_.swap(o.bytes_);
    std::swap(n_, o.n_);
  }

 private:
  ReservedBytes bytes_;
  size_t n_ = 0;
};

}  // namespace memoire
