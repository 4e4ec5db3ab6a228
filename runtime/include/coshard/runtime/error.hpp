#pragma once
// One error vocabulary for every layer: a code the caller can act on, a message that says what
// failed and what to do, and context (rank, op, unit) filled in as the error travels up.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace coshard {

enum class Errc : std::uint8_t {
  timeout,           ///< a deadline expired
  cancelled,         ///< the awaiting task asked to stop
  peer_lost,         ///< a remote rank died or closed its connection
  bad_config,        ///< invalid options, flags or environment
  corrupt_file,      ///< a file failed validation
  out_of_memory,     ///< an allocator cap or the device ran out
  invalid_argument,  ///< API misuse: wrong shape, wrong device, unrecorded event
  device,            ///< a device or driver call failed
  io,                ///< a socket or file operation failed
  internal,          ///< a broken invariant inside coshard
};

std::string_view to_string(Errc code) noexcept;

struct ErrorContext {
  std::optional<int> rank;
  std::string op;    ///< e.g. "all_gather#12", "stream compute"
  std::string unit;  ///< FSDP unit name
};

inline ErrorContext op_context(std::string op) {
  ErrorContext c;
  c.op = std::move(op);
  return c;
}

class Error : public std::runtime_error {
 public:
  Error(Errc code, std::string message, ErrorContext context = {});

  Errc code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  const ErrorContext& context() const noexcept { return context_; }

  /// Returns a copy with more context; fields already set are kept (the innermost knows best).
  Error with_context(ErrorContext more) const;

 private:
  static std::string render(Errc code, const std::string& message, const ErrorContext& ctx);
  Errc code_;
  std::string message_;
  ErrorContext context_;
};

/// Errors as values where the caller is expected to act on them.
template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}    // NOLINT: implicit by design

  bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & {
    throw_if_error();
    return std::get<0>(v_);
  }
  T&& value() && {
    throw_if_error();
    return std::get<0>(std::move(v_));
  }
  const Error& error() const { return std::get<1>(v_); }

 private:
  void throw_if_error() const {
    if (!has_value()) throw std::get<1>(v_);
  }
  std::variant<T, Error> v_;
};

}  // namespace coshard
