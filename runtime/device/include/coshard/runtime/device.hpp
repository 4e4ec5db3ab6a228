#pragma once
#include <compare>
#include <string>

namespace coshard {

/// Which backend a Device belongs to.
enum class DeviceKind : unsigned char { cpu, cuda };

/// A device by backend and index, e.g. cpu:0 or cuda:1. A cheap value type; compare with ==.
struct Device {
  DeviceKind kind = DeviceKind::cpu;  ///< backend
  int index = 0;                     ///< ordinal among devices of that kind

  /// The host as a device. Distinct indices count as distinct devices in stream and event checks.
  static constexpr Device cpu(int index = 0) noexcept { return {DeviceKind::cpu, index}; }
  /// The CUDA device with ordinal `index`, as the CUDA runtime numbers visible devices.
  static constexpr Device cuda(int index) noexcept { return {DeviceKind::cuda, index}; }
  /// Same kind and same index.
  friend constexpr bool operator==(const Device&, const Device&) noexcept = default;
  /// "cpu:N" or "cuda:N", as used in error messages.
  std::string to_string() const {
    return std::string(kind == DeviceKind::cpu ? "cpu:" : "cuda:") + std::to_string(index);
  }
};

}  // namespace coshard
