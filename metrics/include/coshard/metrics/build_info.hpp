#pragma once
// What this binary was built with and what it loaded: the labels of coshard_build_info.
#include <string>

namespace coshard::metrics {

/// The versions this binary was built with and loaded: the labels of coshard_build_info.
struct BuildInfo {
  std::string version;  ///< coshard's CMake project version, e.g. "0.1.0"
  std::string cuda;     ///< CUDA runtime version, e.g. "13.0"; "none" in a build without CUDA
  std::string nccl;     ///< NCCL library version, e.g. "2.28.9"; "none" in a build without NCCL
  std::string ucx;      ///< UCX library version, e.g. "1.13.1"; "n/a" when it cannot be read
  /// launch::kWireProtocol, e.g. "1". Builds that differ here refuse each other's ranks at the
  /// rendezvous, while their `version` may be the same.
  std::string wire_protocol;
};

/// Asks the libraries that are linked; never throws and never needs a device.
BuildInfo build_info();

}  // namespace coshard::metrics
