#include "coshard/runtime/timeout.hpp"

namespace coshard::detail {

void throw_timeout(const std::string& op, std::chrono::nanoseconds limit) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(limit).count();
  throw Error(Errc::timeout,
              "'" + op + "' did not complete within " + std::to_string(ms) +
                  " ms; it was cancelled. Check that every peer is alive, or raise the deadline",
              op_context(op));
}

}  // namespace coshard::detail
