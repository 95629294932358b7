// Status: how the core reports a failed call. Thread-compatible value type.
//
// Every fallible core call returns a Status (or fills an out-parameter and returns one).
// A call that returns an error has changed nothing. The bindings turn a Status into a
// Python exception in one place (bindings/errors.h); asserts are kept for invariants.
#pragma once

#include <sstream>
#include <string>
#include <utility>

namespace memoire {

enum class Code {
  kOk = 0,
  kInvalidArgument,     // bad shape, dtype or value  -> ValueError
  kOutOfRange,          // index out of range         -> IndexError
  kFailedPrecondition,  // wrong state for this call  -> RuntimeError
  kResourceExhausted,   // does not fit               -> memoire.CapacityError (ValueError)
  kDataLoss,            // malformed message or file  -> memoire.ProtocolError (ValueError)
  kInternal,            // a bug                      -> RuntimeError
};

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status OK() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
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
