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

/// What went wrong, coarsely enough for a caller to decide what to do (retry, abort, fix config).
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

/// The enumerator's name, e.g. "peer_lost"; "unknown" for an out-of-range value.
std::string_view to_string(Errc code) noexcept;

/// Where an error happened; any field may be empty. Shown in Error::what() as [rank N] [op X] [unit Y].
struct ErrorContext {
  std::optional<int> rank;  ///< the rank that raised it, when known
  std::string op;    ///< e.g. "all_gather#12", "stream compute"
  std::string unit;  ///< FSDP unit name
};

/// A context with only `op` set, for errors raised below the FSDP layer.
inline ErrorContext op_context(std::string op) {
  ErrorContext c;
  c.op = std::move(op);
  return c;
}

/// The exception every coshard layer throws: a code, a message, and context.
class Error : public std::runtime_error {
 public:
  /// what() renders as "coshard CODE [rank N] [op X] [unit Y]: MESSAGE", skipping empty context.
  Error(Errc code, std::string message, ErrorContext context = {});

  Errc code() const noexcept { return code_; }                       ///< what to act on
  const std::string& message() const noexcept { return message_; }  ///< without code or context
  const ErrorContext& context() const noexcept { return context_; }  ///< where it happened

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
  /// A success holding `value`.
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  /// A failure holding `error`.
  Result(Error error) : v_(std::move(error)) {}    // NOLINT: implicit by design

  bool has_value() const noexcept { return v_.index() == 0; }      ///< true on success
  explicit operator bool() const noexcept { return has_value(); }  ///< same as has_value()

  /// The value; throws the Error when there is none.
  T& value() & {
    throw_if_error();
    return std::get<0>(v_);
  }
  /// Moves the value out of an rvalue Result; throws the Error when there is none.
  T&& value() && {
    throw_if_error();
    return std::get<0>(std::move(v_));
  }
  /// The error. Only valid when has_value() is false (std::bad_variant_access otherwise).
  const Error& error() const { return std::get<1>(v_); }

 private:
  void throw_if_error() const {
    if (!has_value()) throw std::get<1>(v_);
  }
  std::variant<T, Error> v_;
};

}  // namespace coshard
