#include "coshard/runtime/error.hpp"

namespace coshard {

std::string_view to_string(Errc code) noexcept {
  switch (code) {
    case Errc::timeout: return "timeout";
    case Errc::cancelled: return "cancelled";
    case Errc::peer_lost: return "peer_lost";
    case Errc::bad_config: return "bad_config";
    case Errc::corrupt_file: return "corrupt_file";
    case Errc::out_of_memory: return "out_of_memory";
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::device: return "device";
    case Errc::io: return "io";
    case Errc::internal: return "internal";
  }
  return "unknown";
}

Error::Error(Errc code, std::string message, ErrorContext context)
    : std::runtime_error(render(code, message, context)),
      code_(code),
      message_(std::move(message)),
      context_(std::move(context)) {}

Error Error::with_context(ErrorContext more) const {
  ErrorContext merged = context_;
  if (!merged.rank) merged.rank = more.rank;
  if (merged.op.empty()) merged.op = std::move(more.op);
  if (merged.unit.empty()) merged.unit = std::move(more.unit);
  return Error(code_, message_, std::move(merged));
}

std::string Error::render(Errc code, const std::string& message, const ErrorContext& ctx) {
  std::string out = "coshard ";
  out += to_string(code);
  if (ctx.rank) out += " [rank " + std::to_string(*ctx.rank) + "]";
  if (!ctx.op.empty()) out += " [op " + ctx.op + "]";
  if (!ctx.unit.empty()) out += " [unit " + ctx.unit + "]";
  out += ": ";
  out += message;
  return out;
}

}  // namespace coshard
