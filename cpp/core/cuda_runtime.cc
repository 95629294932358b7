#include "core/cuda_runtime.h"

#include <dlfcn.h>

#include <sstream>

namespace memoire {

namespace {

// dlopen flags: RTLD_NOLOAD finds a library some framework already loaded (JAX's or PyTorch's
// own libcudart), so memoire uses that one where it can.
void* Open(const std::string& path, bool loaded_only) {
  return dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | (loaded_only ? RTLD_NOLOAD : 0));
}

template <typename F>
bool Sym(void* lib, const char* name, F* out) {
  void* p = dlsym(lib, name);
  *out = reinterpret_cast<F>(p);
  return p != nullptr;
}

}  // namespace

Status CudaRuntime::Check(int err, const char* what) const {
  if (err == 0) return Status::OK();
  const char* text = GetErrorString != nullptr ? GetErrorString(err) : nullptr;
  return Error(Code::kFailedPrecondition, "CUDA runtime (", path_, "): ", what, " failed: ",
               text != nullptr ? text : "unknown error", " (", err, ")")
      .With("cuda_error", err);
}

Status CudaRuntime::Load(const std::vector<std::string>& paths,
                         std::shared_ptr<CudaRuntime>* out) {
  void* lib = nullptr;
  std::string path;
  for (int pass = 0; pass < 2 && lib == nullptr; ++pass)
    for (const std::string& p : paths)
      if ((lib = Open(p, pass == 0)) != nullptr) {
        path = p;
        break;
      }
  if (lib == nullptr) {
    std::ostringstream tried;
    for (size_t i = 0; i < paths.size(); ++i) tried << (i ? ", " : "") << paths[i];
    const char* last = dlerror();
    return Error(Code::kFailedPrecondition, "CUDA runtime: no libcudart could be loaded (tried ",
                 paths.size(), ": ", tried.str(), "; last error: ",
                 last != nullptr ? last : "none", ")");
  }
  auto rt = std::make_shared<CudaRuntime>();
  rt->path_ = path;
  struct Entry {
    const char* name;
    bool ok;
  };
  const Entry entries[] = {
      {"cudaMalloc", Sym(lib, "cudaMalloc", &rt->Malloc)},
      {"cudaFree", Sym(lib, "cudaFree", &rt->Free)},
      {"cudaHostRegister", Sym(lib, "cudaHostRegister", &rt->HostRegister)},
      {"cudaHostUnregister", Sym(lib, "cudaHostUnregister", &rt->HostUnregister)},
      {"cudaMemcpyAsync", Sym(lib, "cudaMemcpyAsync", &rt->MemcpyAsync)},
      {"cudaStreamCreateWithFlags", Sym(lib, "cudaStreamCreateWithFlags", &rt->StreamCreateWithFlags)},
      {"cudaStreamDestroy", Sym(lib, "cudaStreamDestroy", &rt->StreamDestroy)},
      {"cudaEventCreateWithFlags", Sym(lib, "cudaEventCreateWithFlags", &rt->EventCreateWithFlags)},
      {"cudaEventDestroy", Sym(lib, "cudaEventDestroy", &rt->EventDestroy)},
      {"cudaEventRecord", Sym(lib, "cudaEventRecord", &rt->EventRecord)},
      {"cudaEventSynchronize", Sym(lib, "cudaEventSynchronize", &rt->EventSynchronize)},
      {"cudaEventQuery", Sym(lib, "cudaEventQuery", &rt->EventQuery)},
      {"cudaStreamWaitEvent", Sym(lib, "cudaStreamWaitEvent", &rt->StreamWaitEvent)},
      {"cudaSetDevice", Sym(lib, "cudaSetDevice", &rt->SetDevice)},
      {"cudaGetDevice", Sym(lib, "cudaGetDevice", &rt->GetDevice)},
      {"cudaGetDeviceCount", Sym(lib, "cudaGetDeviceCount", &rt->GetDeviceCount)},
      {"cudaRuntimeGetVersion", Sym(lib, "cudaRuntimeGetVersion", &rt->RuntimeGetVersion)},
      {"cudaGetErrorString", Sym(lib, "cudaGetErrorString", &rt->GetErrorString)},
  };
  for (const Entry& e : entries)
    if (!e.ok)
      return Error(Code::kFailedPrecondition, "CUDA runtime: ", path, " lacks ", e.name,
                   " (not a CUDA runtime library?)");
  MEMOIRE_RETURN_IF_ERROR(rt->Check(rt->RuntimeGetVersion(&rt->version_), "cudaRuntimeGetVersion"));
  if (rt->version_ < 11000)
    return Error(Code::kFailedPrecondition, "CUDA runtime: ", path, " is version ",
                 rt->version_ / 1000, ".", rt->version_ % 1000 / 10, ", expected >= 11.0");
  const int err = rt->GetDeviceCount(&rt->device_count_);
  if (err != 0) {
    Status s = rt->Check(err, "cudaGetDeviceCount");
    return Error(Code::kFailedPrecondition, s.message(), " (libcudart ", rt->version_ / 1000, ".",
                 rt->version_ % 1000 / 10, ": no usable CUDA device or driver)");
  }
  if (rt->device_count_ < 1)
    return Error(Code::kFailedPrecondition, "CUDA runtime: ", path, " sees no CUDA device");
  *out = std::move(rt);
  return Status::OK();
}

}  // namespace memoire
