#pragma once
// The error of a damaged checkpoint: names the file, says what is wrong and what to do.
#include <filesystem>
#include <string>

#include "coshard/runtime/error.hpp"

namespace coshard::fsdp::detail {

// `what` continues the sentence "checkpoint file 'F'": " is missing", ": the bytes of ... fail".
inline Error checkpoint_damaged(const std::filesystem::path& file, const std::string& what) {
  return Error(Errc::corrupt_file, "checkpoint file '" + file.string() + "'" + what +
                                       ". The checkpoint is damaged: resume from an earlier one");
}

// Only an absent piece file, or one of another kind, shows damage. A look that fails otherwise
// (EACCES on a folder, ELOOP, ESTALE) says nothing about the bytes: calling the checkpoint damaged
// would send the user to an older one for a permission they can fix.
inline void require_piece_file(const std::filesystem::path& file) {
  std::error_code ec;
  const auto st = std::filesystem::status(file, ec);
  if (st.type() == std::filesystem::file_type::not_found) throw checkpoint_damaged(file, " is missing");
  if (ec) {
    throw Error(Errc::io, "cannot look at checkpoint file '" + file.string() + "': " + ec.message() +
                              "; the checkpoint may be intact: make it readable to this job and retry");
  }
  // Not exists(): opening a FIFO in its place would block for ever.
  if (!std::filesystem::is_regular_file(st)) throw checkpoint_damaged(file, " is not a regular file");
}

}  // namespace coshard::fsdp::detail
