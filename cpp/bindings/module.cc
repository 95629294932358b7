// memoire._core: the native module. Each area binds itself in its own file; this file only
// lists them, in dependency order.
#include <pybind11/pybind11.h>

namespace memoire {
namespace py = pybind11;
void RegisterErrors(py::module_& m);
void BindBufferPool(py::module_& m);
void BindReplayMemory(py::module_& m);
void BindTransitionStore(py::module_& m);
void BindCircularBuffer(py::module_& m);
void BindCodec(py::module_& m);
void BindProtocol(py::module_& m);
void BindCacheRing(py::module_& m);
void BindChunkIngest(py::module_& m);
void BindFeed(py::module_& m);
void BindDeviceFeed(py::module_& m);
void BindRateLimiter(py::module_& m);
void BindStream(py::module_& m);
}  // namespace memoire

PYBIND11_MODULE(_core, m) {
  m.doc() = "memoire's native core (private: use the memoire package).";
  memoire::RegisterErrors(m);
  memoire::BindBufferPool(m);
  memoire::BindReplayMemory(m);
  memoire::BindTransitionStore(m);
  memoire::BindCircularBuffer(m);
  memoire::BindCodec(m);
  memoire::BindProtocol(m);
  memoire::BindCacheRing(m);
  memoire::BindChunkIngest(m);
  memoire::BindFeed(m);
  memoire::BindDeviceFeed(m);
  memoire::BindRateLimiter(m);
  memoire::BindStream(m);
}
