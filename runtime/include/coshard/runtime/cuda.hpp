#pragma once
// CUDA backend entry points. The header has no CUDA includes so every build sees it; without
// CUDA support, probe() says so and the factories throw.
#include <chrono>
#include <memory>
#include <string>

#include "coshard/runtime/allocator.hpp"
#include "coshard/runtime/stream.hpp"

namespace coshard::cuda {

struct Probe {
  int devices = 0;
  std::string reason;  ///< why there is no usable device, when devices == 0
};
/// Asks the runtime how many devices there are. No driver, no device or a build without CUDA
/// all give 0 with the reason, never an exception.
Probe probe();

/// Polls recorded CUDA events with a bounded back-off and hands completions to their waiters
/// (which post to their scheduler). One per device; a service with start/stop.
class EventPoller {
 public:
  struct Options {
    std::chrono::microseconds min_backoff{5};
    std::chrono::microseconds max_backoff{500};
  };
  explicit EventPoller(Device device);
  EventPoller(Device device, Options options);
  EventPoller(const EventPoller&) = delete;
  EventPoller& operator=(const EventPoller&) = delete;
  ~EventPoller();
  void start();
  void stop();
  struct Impl;
  Impl& impl() noexcept { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

/// A non-blocking CUDA stream on `device` whose events complete through `poller`.
Stream make_stream(Device device, std::string name, EventPoller& poller);
/// cudaMalloc-backed memory for the caching Allocator.
std::unique_ptr<MemoryResource> device_memory(Device device);

}  // namespace coshard::cuda
