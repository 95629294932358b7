// _core.DeviceFeed, _core.DeviceArray, _core.CudaRuntime: a ring of device slots filled from a
// _core.Feed's host ring by a native copy thread (core/device_ring.h), handed to Python as
// DLPack producers (`__dlpack__`, `__dlpack_device__`): JAX, PyTorch, CuPy and numpy take them
// zero-copy.
//
// Slots are lent, not given: `views(slot)` builds a slot's arrays once (the framework imports
// them once, when the slot first comes round), `take_slot()` hands out the next ready slot and
// `release(slot, stream)` gives it back when the consumer says what read it is done. So a
// learner's take costs a slot index, never an import. A slot whose arrays the consumer wants
// freed instead (`DeviceArray.give_back_when_freed`) goes back when the last of them is freed:
// the DLPack deleter, called by the framework once the work queued on them is done.
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings/common.h"
#include "bindings/device_feed.h"
#include "core/cuda_runtime.h"
#include "core/device_ring.h"

namespace memoire {

namespace {

// DLPack's ABI (dlpack.h, v1.0; the unversioned struct is v0.8's), declared here: no header
// dependency.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr const char* kLegacyName = "dltensor";
constexpr const char* kVersionedName = "dltensor_versioned";

// What keeps a slot's memory (and the ring) alive while arrays view it. Lent views never give
// the slot back when freed (the consumer calls release); after give_back_when_freed, the last
// holder's going (a DeviceArray, a DLPack tensor a framework imported) gives it back.
struct Lease {
  std::shared_ptr<DeviceRing> ring;
  int slot;
  // The consumer's stream (DLPack's integer) its last __dlpack__ named: the next copy into the
  // slot waits for the work queued there before the release. -1: none named.
  std::atomic<int64_t> stream{-1};
  std::atomic<bool> give_back{false};
  Lease(std::shared_ptr<DeviceRing> r, int s) : ring(std::move(r)), slot(s) {}
  ~Lease() {
    if (give_back.load()) ring->Release(slot, stream.load());
  }
};

// What a DLPack tensor owns: the lease and its shape/strides arrays.
struct Export {
  std::shared_ptr<Lease> lease;
  std::vector<int64_t> shape, strides;
  DLManagedTensor legacy{};
  DLManagedTensorVersioned versioned{};
};

void DeleteLegacy(DLManagedTensor* self) { delete static_cast<Export*>(self->manager_ctx); }
void DeleteVersioned(DLManagedTensorVersioned* self) {
  delete static_cast<Export*>(self->manager_ctx);
}

// An unconsumed capsule owns its tensor; a consumer renames it ("used_dltensor") and then owns it.
void CapsuleDestructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kLegacyName)) {
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kLegacyName));
    if (t->deleter != nullptr) t->deleter(t);
  } else if (PyCapsule_IsValid(capsule, kVersionedName)) {
    auto* t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, kVersionedName));
    if (t->deleter != nullptr) t->deleter(t);
  }
}

DLDataType DLTypeOf(const py::dtype& dt) {
  const char kind = dt.kind();
  DLDataType t{0, static_cast<uint8_t>(dt.itemsize() * 8), 1};
  switch (kind) {
    case 'i': t.code = 0; break;  // kDLInt
    case 'u': t.code = 1; break;  // kDLUInt
    case 'f': t.code = 2; break;  // kDLFloat
    case 'b': t.code = 6; break;  // kDLBool
    default:
      ThrowInvalid(std::string("DLPack: unsupported dtype kind '") + kind + "'");
  }
  return t;
}

// One part of a taken batch in a device slot, as a DLPack producer.
class DeviceArray {
 public:
  DeviceArray(std::shared_ptr<Lease> lease, uint8_t* data, py::dtype dtype,
              std::vector<py::ssize_t> shape)
      : lease_(std::move(lease)), data_(data), dtype_(std::move(dtype)), shape_(std::move(shape)) {}

  py::object DLPack(const py::object& stream, const py::object& max_version,
                    const py::object& dl_device, const py::object& copy) {
    const DeviceRing& ring = *lease_->ring;
    if (!dl_device.is_none()) {
      auto d = dl_device.cast<std::pair<int, int>>();
      if (d.first != ring.dl_device_type() || d.second != ring.device_id())
        throw py::buffer_error("DLPack: the batch is on device (" +
                               std::to_string(ring.dl_device_type()) + ", " +
                               std::to_string(ring.device_id()) + "); no cross-device export");
    }
    if (!copy.is_none() && copy.cast<bool>())
      throw py::buffer_error("DLPack: copy=True is not supported (the export is zero-copy)");
    if (ring.dl_device_type() == 2) {
      // CUDA: None means the legacy default stream (1); -1 asks for no ordering.
      const int64_t s = stream.is_none() ? 1 : stream.cast<int64_t>();
      ThrowIfError(lease_->ring->ConsumerWait(lease_->slot, s));
      if (s != -1) lease_->stream.store(s);
    }
    auto* e = new Export{lease_, {}, {}, {}, {}};
    int64_t stride = 1;
    e->shape.assign(shape_.begin(), shape_.end());
    e->strides.assign(shape_.size(), 1);
    for (size_t i = shape_.size(); i-- > 0;) {
      e->strides[i] = stride;
      stride *= shape_[i];
    }
    DLTensor t{data_,
               {ring.dl_device_type(), ring.device_id()},
               static_cast<int32_t>(shape_.size()),
               DLTypeOf(dtype_),
               e->shape.data(),
               e->strides.data(),
               0};
    const bool versioned =
        !max_version.is_none() && max_version.cast<std::pair<int, int>>().first >= 1;
    PyObject* capsule;
    if (versioned) {
      e->versioned = {{1, 0}, e, &DeleteVersioned, 0, t};
      capsule = PyCapsule_New(&e->versioned, kVersionedName, &CapsuleDestructor);
    } else {
      e->legacy = {t, e, &DeleteLegacy};
      capsule = PyCapsule_New(&e->legacy, kLegacyName, &CapsuleDestructor);
    }
    if (capsule == nullptr) {
      delete e;
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(capsule);
  }

  py::tuple DLPackDevice() const {
    return py::make_tuple(lease_->ring->dl_device_type(), lease_->ring->device_id());
  }
  py::tuple shape() const { return py::cast(shape_); }
  const py::dtype& dtype() const { return dtype_; }
  int64_t nbytes() const {
    int64_t n = dtype_.itemsize();
    for (py::ssize_t d : shape_) n *= d;
    return n;
  }
  uintptr_t pointer() const { return reinterpret_cast<uintptr_t>(data_); }
  int slot() const { return lease_->slot; }
  void GiveBackWhenFreed() { lease_->give_back.store(true); }
  int64_t stream() const { return lease_->stream.load(); }

 private:
  std::shared_ptr<Lease> lease_;
  uint8_t* data_;
  py::dtype dtype_;
  std::vector<py::ssize_t> shape_;
};

class PyDeviceFeed {
 public:
  PyDeviceFeed(const py::object& feed, const py::object& runtime, int device, int slots,
               std::optional<std::vector<bool>> to_device, std::optional<std::vector<int64_t>> trim,
               std::optional<std::vector<bool>> narrow)
      : feed_(feed) {
    FeedRing host = FeedRingOf(feed);
    dtypes_ = host.dtypes;
    shapes_ = host.shapes;
    none_ = host.none;
    DeviceRing::Options o;
    o.slots = slots;
    if (to_device) o.to_device = *to_device;
    if (trim) {
      // (part, count part, count index): the part's first dimension is the count.
      if (trim->size() != 3) ThrowInvalid("trim: expected (part, count part, count index)");
      const int64_t part = (*trim)[0];
      if (part < 0 || part >= static_cast<int64_t>(shapes_.size()) || shapes_[part].empty())
        ThrowInvalid("trim: expected an array part, got " + std::to_string(part));
      size_t unit = static_cast<size_t>(dtypes_[part].itemsize());
      for (size_t i = 1; i < shapes_[part].size(); ++i) unit *= shapes_[part][i];
      o.trim_part = static_cast<int>(part);
      o.trim_count_part = static_cast<int>((*trim)[1]);
      o.trim_count_index = static_cast<int>((*trim)[2]);
      o.trim_unit = unit;
    }
    if (narrow) {
      if (narrow->size() != dtypes_.size())
        ThrowInvalid("narrow: expected " + std::to_string(dtypes_.size()) + " flags, got " +
                     std::to_string(narrow->size()));
      o.narrow.assign(dtypes_.size(), DeviceRing::kNarrowNone);
      for (size_t i = 0; i < dtypes_.size(); ++i) {
        if (!(*narrow)[i]) continue;
        const char kind = dtypes_[i].kind();
        if (dtypes_[i].itemsize() != 8 || (kind != 'f' && kind != 'i' && kind != 'u'))
          ThrowInvalid("narrow: part " + std::to_string(i) + " is not a 64-bit number");
        o.narrow[i] = kind == 'f' ? DeviceRing::kNarrowFloat : DeviceRing::kNarrowInt;
        dtypes_[i] = py::dtype(std::string(1, kind) + "4");  // what the device part holds
      }
    }
    std::unique_ptr<CopyEngine> engine;
    if (runtime.is_none()) {
      if (device != 0) ThrowInvalid("device: the host stand-in has device 0 only");
      engine = MakeHostCopyEngine();
    } else {
      ThrowIfError(MakeCudaCopyEngine(runtime.cast<std::shared_ptr<CudaRuntime>>(), device,
                                      &engine));
    }
    CallReleased([&] {
      return DeviceRing::Make(o, host.batches, std::move(engine), &ring_);
    });
  }

  ~PyDeviceFeed() {
    try {
      Close();  // the host feed first: a stream's receive must stop before its ring joins
    } catch (...) {  // a destructor does not throw; the ring's own destructor joins regardless
    }
  }

  // The next ready slot (blocks without the GIL), lent until release(slot); or the draw's
  // error (its slot already given back).
  int TakeSlot() {
    std::shared_ptr<DeviceRing> ring = Ring();
    int slot = -1;
    Status s;
    if (!ring->TryTake(&slot, &s)) {  // the GIL is let go only to wait
      GilRelease release;
      s = ring->Take(&slot);
    }
    if (slot < 0) ThrowIfError(s);
    if (!s.ok()) {
      ring->Release(slot, -1);
      ThrowIfError(s);
    }
    return slot;
  }

  // Slot `slot`'s arrays: a DeviceArray per device part (its whole capacity: a trimmed part's
  // first dimension is what it can hold), a numpy view of the slot's host mirror per host part,
  // None per part the layout leaves out. They view the slot whatever batch it holds, and never
  // give it back when freed (unless give_back_when_freed is called on one).
  py::tuple Views(int slot) {
    std::shared_ptr<DeviceRing> ring = Ring();
    if (slot < 0 || slot >= ring->slots())
      ThrowInvalid("slot: expected one in [0, " + std::to_string(ring->slots()) + "), got " +
                   std::to_string(slot));
    auto lease = std::make_shared<Lease>(ring, slot);
    py::tuple out(dtypes_.size());
    py::object keep;  // one capsule for every host view of this slot
    for (size_t i = 0; i < dtypes_.size(); ++i) {
      if (none_[i]) {
        out[i] = py::none();
      } else if (ring->on_device(static_cast<int>(i))) {
        out[i] = py::cast(DeviceArray(lease, ring->device_part(slot, static_cast<int>(i)),
                                      dtypes_[i], shapes_[i]));
      } else {
        if (!keep) {
          keep = py::capsule(new std::shared_ptr<Lease>(lease), [](void* p) {
            delete static_cast<std::shared_ptr<Lease>*>(p);
          });
        }
        out[i] = py::array(dtypes_[i], shapes_[i], ring->host_part(slot, static_cast<int>(i)),
                           keep);
      }
    }
    return out;
  }

  // Gives a taken slot back; the next copy into it waits for the work queued on `stream` so far
  // (DLPack's integer: -1 none, as when what read the slot is known to be done).
  void Release(int slot, int64_t stream) { Ring()->Release(slot, stream); }

  // Bytes the slot's last copy moved to the device (a trimmed part's rows only).
  int64_t CopiedBytes(int slot) const {
    int64_t n = 0;
    for (size_t i = 0; i < dtypes_.size(); ++i)
      if (!none_[i] && ring_->on_device(static_cast<int>(i)))
        n += static_cast<int64_t>(ring_->copied_bytes(slot, static_cast<int>(i)));
    return n;
  }

  void Close() {
    if (!ring_ || closed_) return;
    closed_ = true;
    // Stops the samplers (and a stream's receive) first; a shared-memory stream's source
    // stops taking notices.
    feed_.attr(py::hasattr(feed_, "close") ? "close" : "stop")();
    std::shared_ptr<DeviceRing> ring = ring_;
    GilRelease release;
    ring->Close();
  }

  int slots() const { return ring_->slots(); }
  int pinned() const { return ring_->pinned(); }
  int held() const { return ring_->held(); }
  int64_t copied() const { return ring_->copied(); }
  int64_t taken() const { return ring_->taken(); }
  int64_t last_copy_bytes() const { return ring_->last_copy_bytes(); }
  py::tuple dlpack_device() const {
    return py::make_tuple(ring_->dl_device_type(), ring_->device_id());
  }

 private:
  std::shared_ptr<DeviceRing> Ring() const {
    if (!ring_ || closed_) ThrowIfError(Error(Code::kFailedPrecondition, "the feed is closed"));
    return ring_;
  }

  py::object feed_;  // the host _core.Feed (its samplers fill the ring), or a StreamSource
  std::vector<py::dtype> dtypes_;  // as the device holds them (narrowed parts 32-bit)
  std::vector<std::vector<py::ssize_t>> shapes_;
  std::vector<bool> none_;
  std::shared_ptr<DeviceRing> ring_;
  bool closed_ = false;
};

}  // namespace

void BindDeviceFeed(py::module_& m) {
  py::class_<CudaRuntime, std::shared_ptr<CudaRuntime>>(m, "CudaRuntime", R"doc(
The CUDA runtime library, loaded at run time (private: use memoire._cuda.runtime()).

CudaRuntime(paths): the first of `paths` (file names for the default loader path, or absolute
paths) already loaded in the process, else the first that loads, with the functions memoire
needs, version >= 11.0 and a device. RuntimeError, one line naming what was found, otherwise.
)doc")
      .def(py::init([](const std::vector<std::string>& paths) {
             std::shared_ptr<CudaRuntime> rt;
             Status s;
             {
               GilRelease release;
               s = CudaRuntime::Load(paths, &rt);
             }
             ThrowIfError(s);
             return rt;
           }),
           py::arg("paths"))
      .def_property_readonly("path", &CudaRuntime::path, "the library loaded")
      .def_property_readonly("version", &CudaRuntime::version, "e.g. 12040 for CUDA 12.4")
      .def_property_readonly("device_count", &CudaRuntime::device_count);

  py::class_<DeviceArray>(m, "DeviceArray", R"doc(
One array of a device batch (private: memoire.feed.Feed hands out the framework's arrays).

A DLPack producer: `__dlpack__(stream=None, max_version=None, dl_device=None, copy=None)`
returns a capsule viewing the device slot (zero-copy); on CUDA the consumer's `stream` is
ordered after the slot's copy (cudaStreamWaitEvent; never blocks). `__dlpack_device__()`:
(1, 0) for the host stand-in, (2, n) for CUDA device n. The memory stays valid while this
object or a tensor imported from it lives; the slot itself is lent (DeviceFeed.release).
)doc")
      .def("__dlpack__", &DeviceArray::DLPack, py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none())
      .def("__dlpack_device__", &DeviceArray::DLPackDevice)
      .def_property_readonly("shape", &DeviceArray::shape)
      .def_property_readonly("dtype", &DeviceArray::dtype)
      .def_property_readonly("nbytes", &DeviceArray::nbytes)
      .def_property_readonly("pointer", &DeviceArray::pointer, "the data's address (int)")
      .def_property_readonly("slot", &DeviceArray::slot, "the device slot it views")
      .def_property_readonly("stream", &DeviceArray::stream,
                             "the stream the last __dlpack__ named (-1: none)")
      .def("give_back_when_freed", &DeviceArray::GiveBackWhenFreed,
           "From now on the slot goes back to the ring when every array viewing it (its "
           "DeviceArrays, what frameworks imported from them) is freed, instead of by "
           "DeviceFeed.release.");

  py::class_<PyDeviceFeed>(m, "DeviceFeed", R"doc(
A ring of device slots filled from a Feed's host ring (private: use memoire.feed.Feed(device=)).

DeviceFeed(feed, runtime=None, device=0, slots=3, to_device=None, trim=None, narrow=None): a
native copy thread copies each host batch of `feed` (a _core.Feed, or a shared-memory
StreamSource: the server's slots are the host ring) into one of `slots` device
slots: with `runtime` (a CudaRuntime) by cudaMemcpyAsync on its own stream into device
`device`'s memory, the host ring page-locked; with None by memcpy into host memory (the
stand-in, DLPack kDLCPU). `to_device[i]` False keeps part i on the host (copied into the slot's
host mirror). `trim=(part, count_part, index)` copies only count_part[index] rows of `part`.
`narrow[i]` True turns 64-bit part i into its 32-bit dtype on the way (float64 -> float32 as
numpy's astype, integers to their low 32 bits).
Slots are lent: take_slot() -> the next ready slot, views(slot) -> its arrays (built once per
slot by the caller), release(slot, stream) gives it back.
)doc")
      .def(py::init<const py::object&, const py::object&, int, int,
                    std::optional<std::vector<bool>>, std::optional<std::vector<int64_t>>,
                    std::optional<std::vector<bool>>>(),
           py::arg("feed"), py::arg("runtime") = py::none(), py::arg("device") = 0,
           py::arg("slots") = 3, py::arg("to_device") = py::none(), py::arg("trim") = py::none(),
           py::arg("narrow") = py::none())
      .def("take_slot", &PyDeviceFeed::TakeSlot,
           "The next ready slot (int), lent until release; blocks without the GIL. Raises the "
           "draw's error (the slot given back), or RuntimeError when closed or when every slot "
           "stayed lent.")
      .def("views", &PyDeviceFeed::Views, py::arg("slot"),
           "Slot `slot`'s arrays (tuple): DeviceArray per device part (a trimmed part at its "
           "full capacity), a numpy view of the slot's host mirror per host part, None per part "
           "left out. They view whatever batch the slot holds; freeing them gives nothing back.")
      .def("release", &PyDeviceFeed::Release, py::arg("slot"), py::arg("stream") = -1,
           "Gives a lent slot back (ignored when it is not lent); the next copy into it waits "
           "for the work queued on `stream` (DLPack's integer; -1: nothing to wait for).")
      .def("copied_bytes", &PyDeviceFeed::CopiedBytes, py::arg("slot"),
           "Bytes the slot's last copy moved to the device.")
      .def("close", &PyDeviceFeed::Close,
           "Closes the host feed, then joins the copy thread (idempotent). Arrays handed out "
           "stay valid.")
      .def_property_readonly("slots", &PyDeviceFeed::slots)
      .def_property_readonly("held", &PyDeviceFeed::held, "slots held by batches in use")
      .def_property_readonly("pinned", &PyDeviceFeed::pinned,
                             "host ring slots page-locked (CUDA; 0 for the host stand-in)")
      .def_property_readonly("copied", &PyDeviceFeed::copied, "batches copied so far")
      .def_property_readonly("taken", &PyDeviceFeed::taken, "batches handed out so far")
      .def_property_readonly("last_copy_bytes", &PyDeviceFeed::last_copy_bytes,
                             "bytes the last copy moved to the device")
      .def_property_readonly("dlpack_device", &PyDeviceFeed::dlpack_device);
}

}  // namespace memoire
