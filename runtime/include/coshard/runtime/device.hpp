#pragma once
#include <compare>
#include <string>

namespace coshard {

enum class DeviceKind : unsigned char { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static constexpr Device cpu(int index = 0) noexcept { return {DeviceKind::cpu, index}; }
  static constexpr Device cuda(int index) noexcept { return {DeviceKind::cuda, index}; }
  friend constexpr bool operator==(const Device&, const Device&) noexcept = default;
  std::string to_string() const {
    return std::string(kind == DeviceKind::cpu ? "cpu:" : "cuda:") + std::to_string(index);
  }
};

}  // namespace coshard
