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

}  // namespace coshard::fsdp::detail
