// Status: how the core reports a failed call. Thread-compatible value type.
//
// Every fallible core call returns a Status (or fills an out-parameter and returns one).
// A call that returns an error has changed nothing. The bindings turn a Status into a Python
// exception in one place (ThrowIfError in bindings/common.h); asserts are kept for invariants.
//
// A Status carries, beside its message for people, named integers for callers that act on the
// error (details): the missing key, an index and its bound, a count. Python sees each as an
// attribute of the exception (a kNotFound's "key" is also the KeyError's argument), so no
// caller parses a message. Names in use:
//   key                the key or slot that is not stored (kNotFound)
//   index, bound       an index outside [0, bound) (kOutOfRange)
//   field              the schema field an argument was for (kInvalidArgument)
//   expected, received counts that should have matched (kInvalidArgument)
//   needed             transitions a sample needs stored before it can draw (kFailedPrecondition)
//   sampled            valid draws made before the attempts ran out (kFailedPrecondition)
//   length             steps of an n-step trajectory (kInvalidArgument: reward shape)
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace memoire {

// Each code maps to exactly one Python exception type.
enum class Code {
  kOk = 0,
  kInvalidArgument,     // bad shape, dtype or value  -> ValueError
  kOutOfRange,          // index out of range         -> IndexError
  kNotFound,            // key or slot not stored     -> KeyError(key)
  kFailedPrecondition,  // wrong state for this call  -> RuntimeError
  kResourceExhausted,   // does not fit               -> memoire.CapacityError (ValueError)
  kDataLoss,            // malformed message or file  -> memoire.ProtocolError (ValueError)
  kInternal,            // a bug                      -> RuntimeError
};

class Status {
 public:
  using Detail = std::pair<const char*, int64_t>;  // name: a string literal

  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status OK() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // Adds the detail `name` (a string literal, see the list above): Error(...).With("key", k).
  Status& With(const char* name, int64_t value) & {
    details_.emplace_back(name, value);
    return *this;
  }
  Status&& With(const char* name, int64_t value) && { return std::move(With(name, value)); }
  const std::vector<Detail>& details() const { return details_; }
  std::optional<int64_t> detail(const std::string& name) const {
    for (const Detail& d : details_)
      if (name == d.first) return d.second;
    return std::nullopt;
  }

 private:
  Code code_ = Code::kOk;
  std::string message_;
  std::vector<Detail> details_;
};

// Builds a message from streamable parts: Error(Code::kInvalidArgument, "expected ", n, " got ", m).
template <typename... Parts>
Status Error(Code code, const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return Status(code, os.str());
}

#define MEMOIRE_RETURN_IF_ERROR(expr)        \
  do {                                       \
    ::memoire::Status _st = (expr);          \
    if (!_st.ok()) return _st;               \
  } while (0)

}  // namespace memoire
