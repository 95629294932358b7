// CudaRuntime: the few CUDA runtime functions the device feed needs, loaded at run time.
//
// memoire has no CUDA build dependency: libcudart is dlopen'ed from where JAX's and PyTorch's
// CUDA wheels put it (memoire/_cuda.py lists the candidates), or from the default loader path.
// The functions are declared here with the runtime's C ABI (handles as void*, errors as int),
// which has been stable since CUDA 10. The library is never dlclose'd: device memory and
// streams of a feed may outlive every Python reference to it (an array freed at exit).
//
// Thread-safety: the loaded table is immutable; the CUDA runtime's functions are thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace memoire {

class CudaRuntime {
 public:
  // cudaMemcpyKind / flags used here (values of the runtime's enums).
  static constexpr int kMemcpyHostToDevice = 1;
  static constexpr int kStreamNonBlocking = 0x01;
  static constexpr int kEventDisableTiming = 0x02;
  static constexpr int kHostRegisterPortable = 0x01;
  static constexpr int kErrorNotReady = 600;

  // The first of `paths` (file names for the default loader path, or absolute paths) that is
  // already loaded in the process, else the first that loads, with every needed symbol, a
  // version >= 11.0 and at least one device. kFailedPrecondition with one line naming what was
  // found (no library; a library lacking a symbol; its version; the device count's error).
  static Status Load(const std::vector<std::string>& paths, std::shared_ptr<CudaRuntime>* out);

  const std::string& path() const { return path_; }
  int version() const { return version_; }  // e.g. 12040 for 12.4
  int device_count() const { return device_count_; }
  // "what (cudaErrorName-ish text, code)" for a failed call, or OK.
  Status Check(int err, const char* what) const;

  // The runtime's functions (cudaError_t as int, handles as void*).
  int (*Malloc)(void** ptr, size_t bytes) = nullptr;
  int (*Free)(void* ptr) = nullptr;
  int (*HostRegister)(void* ptr, size_t bytes, unsigned int flags) = nullptr;
  int (*HostUnregister)(void* ptr) = nullptr;
  int (*MemcpyAsync)(void* dst, const void* src, size_t bytes, int kind, void* stream) = nullptr;
  int (*StreamCreateWithFlags)(void** stream, unsigned int flags) = nullptr;
  int (*StreamDestroy)(void* stream) = nullptr;
  int (*EventCreateWithFlags)(void** event, unsigned int flags) = nullptr;
  int (*EventDestroy)(void* event) = nullptr;
  int (*EventRecord)(void* event, void* stream) = nullptr;
  int (*EventSynchronize)(void* event) = nullptr;
  int (*EventQuery)(void* event) = nullptr;
  int (*StreamWaitEvent)(void* stream, void* event, unsigned int flags) = nullptr;
  int (*SetDevice)(int device) = nullptr;
  int (*GetDevice)(int* device) = nullptr;
  int (*GetDeviceCount)(int* count) = nullptr;
  int (*RuntimeGetVersion)(int* version) = nullptr;
  const char* (*GetErrorString)(int err) = nullptr;

 private:
  std::string path_;
  int version_ = 0;
  int device_count_ = 0;
};

}  // namespace memoire
