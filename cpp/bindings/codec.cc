// Binds core/codec.h: header encode/decode and schema checks for memoire.codec, which pairs the
// header with the raw data frames (numpy buffers) on the Python side.
#include "core/codec.h"

#include <pybind11/stl.h>

#include "bindings/common.h"
#include "bindings/frames.h"

namespace memoire {
namespace {

using codec::ArraySpec;
using codec::Entry;
using codec::Kind;
using codec::Message;

DType DTypeCode(int code, const char* what) {
  if (code < 0 || code >= kNumDTypes)
    throw py::value_error(std::string(what) + ": unknown dtype code " + std::to_string(code));
  return static_cast<DType>(code);
}

py::tuple EntryTuple(const Entry& e) {
  return py::make_tuple(e.name, static_cast<int>(e.kind), static_cast<int>(e.dtype),
                        py::tuple(py::cast(e.shape)), e.frame, e.depth);
}

// The bytes of a header frame, exported until `held` goes: only a C-contiguous buffer is
// accepted (a strided view, e.g. a reversed array, starts its first element elsewhere than its
// bytes, so reading its length from that pointer would run off its end).
codec::Frame HeaderBytes(const py::buffer& header, HeldFrames* held) {
  if (!held->Add(header.ptr()))
    throw py::value_error("header: expected a C-contiguous bytes-like object (bytes, a "
                          "zmq.Frame, a contiguous array); got a strided view: copy it first");
  return held->frames()[0];
}

struct PySpec {
  std::vector<ArraySpec> specs;
  bool allow_extra = false;
};

}  // namespace

void BindCodec(py::module_& m) {
  m.attr("WIRE_VERSION") = codec::kWireVersion;
  py::list names;
  for (int i = 0; i < kNumDTypes; ++i) names.append(DTypeName(static_cast<DType>(i)));
  m.attr("WIRE_DTYPES") = names;

  py::class_<Message>(m, "WireMessage", R"doc(
A decoded, checked header: the message type, flags and entry table. Entries are tuples
(name, kind, dtype_code, shape, frame, depth); frame indexes the data frames (-1 for none).
)doc")
      .def_property_readonly("version", [](const Message& msg) { return msg.version; })
      .def_property_readonly("type", [](const Message& msg) { return static_cast<int>(msg.type); })
      .def_property_readonly("flags", [](const Message& msg) { return msg.flags; })
      .def_property_readonly("entries", [](const Message& msg) {
        py::list out;
        for (const Entry& e : msg.entries) out.append(EntryTuple(e));
        return out;
      })
      .def("check", [](const Message& msg, const PySpec& spec) {
        int64_t batch = -1;
        ThrowIfError(codec::CheckArrays(msg, spec.specs, spec.allow_extra, &batch));
        return batch;
      }, py::arg("spec"), "Raises ProtocolError unless the top-level arrays match `spec`; "
                          "returns the agreed -1 dimension (or -1).");

  py::class_<PySpec>(m, "WireSpec", R"doc(
Expected top-level arrays of a message: a list of (name, dtype_code, shape, optional). A
dimension of -1 matches any size, the same for all -1 dimensions (the batch size).
)doc")
      .def(py::init([](const std::vector<std::tuple<std::string, int, std::vector<int64_t>, bool>>& specs,
                       bool allow_extra) {
             PySpec s;
             s.allow_extra = allow_extra;
             for (const auto& [name, code, shape, optional] : specs)
               s.specs.push_back({name, DTypeCode(code, name.c_str()), shape, optional});
             return s;
           }),
           py::arg("specs"), py::arg("allow_extra") = false);

  m.def("encode_header",
        [](int type, int flags, const std::vector<std::tuple<std::string, int, int, std::vector<int64_t>>>& entries,
           int version) {
          Message msg;
          if (type < 0 || type > 255) throw py::value_error("message type: expected 1..255");
          if (flags < 0 || flags > 255) throw py::value_error("flags: expected 0..255");
          if (version < 0 || version > 65535) throw py::value_error("version: expected 0..65535");
          msg.version = static_cast<uint16_t>(version);
          msg.type = static_cast<codec::MsgType>(type);
          msg.flags = static_cast<uint8_t>(flags);
          for (const auto& [name, kind, code, shape] : entries) {
            Entry e;
            e.name = name;
            if (kind < 0 || kind >= codec::kNumKinds)
              throw py::value_error("entry '" + name + "': unknown kind " + std::to_string(kind));
            e.kind = static_cast<Kind>(kind);
            e.dtype = DTypeCode(code, name.c_str());
            e.shape = shape;
            msg.entries.push_back(std::move(e));
          }
          ThrowIfError(codec::Finalize(&msg));
          std::string out;
          ThrowIfError(codec::EncodeHeader(msg, &out));
          return py::bytes(out);
        },
        py::arg("type"), py::arg("flags"), py::arg("entries"),
        py::arg("version") = codec::kWireVersion,
        "Header frame bytes for entries (name, kind, dtype_code, shape). Raises ValueError on a "
        "table that cannot be encoded.");

  // The hot messages (caches, chunks) are flat tables of arrays: one native call writes their
  // header, where the general Python encoder spends microseconds per value.
  m.def("encode_flat",
        [](int type, int flags, const py::dict& values) -> py::object {
          if (type < 1 || type > codec::kMaxMsgType) throw py::value_error("message type: expected 1.." + std::to_string(codec::kMaxMsgType));
          if (flags < 0 || flags > 255) throw py::value_error("flags: expected 0..255");
          Message msg;
          msg.type = static_cast<codec::MsgType>(type);
          msg.flags = static_cast<uint8_t>(flags);
          msg.entries.reserve(values.size());
          for (auto item : values) {
            if (!py::isinstance<py::str>(item.first) || !py::isinstance<py::array>(item.second))
              return py::none();
            py::array a = py::reinterpret_borrow<py::array>(item.second);
            const py::dtype dt = a.dtype();
            const char order = dt.byteorder();  // '=', '<', '|' travel as they are
            if (!(a.flags() & py::array::c_style) || order == '>' || dt.kind() == 'c' ||
                dt.kind() == 'O' || dt.kind() == 'V' || dt.kind() == 'U' || dt.kind() == 'S' ||
                dt.kind() == 'M' || dt.kind() == 'm')
              return py::none();
            Entry e;
            e.name = item.first.cast<std::string>();
            e.kind = Kind::kArray;
            e.dtype = FromNumpy(dt, e.name);
            e.shape = ShapeOf(a);
            msg.entries.push_back(std::move(e));
          }
          ThrowIfError(codec::Finalize(&msg));
          std::string out;
          ThrowIfError(codec::EncodeHeader(msg, &out));
          return py::bytes(out);
        },
        py::arg("type"), py::arg("flags"), py::arg("values"),
        "Header frame bytes for a flat mapping of names to C-contiguous little-endian numpy "
        "arrays (the arrays are the data frames, in order); None when a value is anything else "
        "(the general encoder handles it).");

  m.def("decode_header",
        [](py::buffer header, const std::vector<uint64_t>& frame_sizes, uint64_t max_payload_bytes,
           uint32_t max_entries) {
          HeldFrames held;
          const codec::Frame bytes = HeaderBytes(header, &held);
          codec::Limits limits;
          limits.max_payload_bytes = max_payload_bytes;
          limits.max_entries = max_entries;
          Message msg;
          ThrowIfError(codec::DecodeHeader(bytes.data, static_cast<size_t>(bytes.size),
                                           frame_sizes.data(), frame_sizes.size(), limits, &msg));
          return msg;
        },
        py::arg("header"), py::arg("frame_sizes"), py::arg("max_payload_bytes") = uint64_t(1) << 32,
        py::arg("max_entries") = 65536,
        "Parses and checks a header frame against the data frame sizes. Raises ProtocolError "
        "with the reason.");

  m.def("peek_header",
        [](py::buffer header) -> py::object {
          HeldFrames held;
          const codec::Frame bytes = HeaderBytes(header, &held);
          uint16_t version = 0;
          uint8_t type = 0;
          if (!codec::PeekVersion(bytes.data, static_cast<size_t>(bytes.size), &version, &type))
            return py::none();
          return py::make_tuple(version, type);
        },
        py::arg("header"), "(version, type) when the frame starts like a memoire header, else None.");
}

}  // namespace memoire
