#include "coshard/runtime/runtime.hpp"

#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/discrete_memory.hpp"
#include "coshard/runtime/shared_memory.hpp"

namespace coshard {

Runtime::Runtime(Options options) : options_(std::move(options)) {
  telemetry_ = options_.telemetry ? options_.telemetry : &noop_;
  Allocator::Options alloc_options{.cap_bytes = options_.memory_cap_bytes};
  if (options_.device.kind == DeviceKind::cuda) {
    if (options_.stream_jitter.count() > 0) {
      throw Error(Errc::invalid_argument, "stream jitter (fault injection) needs the CPU backend, not " +
                                              options_.device.to_string() + ": set it to 0 on CUDA devices");
    }
    if (options_.discrete_memory) {
      throw Error(Errc::invalid_argument, "discrete memory is a mode of the CPU device (cpu-discrete); " +
                                              options_.device.to_string() + " memory is device memory already");
    }
    auto probe = cuda::probe();
    if (options_.device.index >= probe.devices) {
      throw Error(Errc::device, "cannot use " + options_.device.to_string() + ": " +
                                    (probe.devices ? std::to_string(probe.devices) + " CUDA device(s) visible"
                                                   : probe.reason) +
                                    ". Pick a visible device, or run on the CPU backend");
    }
    poller_ = std::make_unique<cuda::EventPoller>(options_.device);
    poller_->start();
    allocator_ = std::make_unique<Allocator>(cuda::device_memory(options_.device), alloc_options);
  } else if (options_.discrete_memory) {
    auto memory = std::make_unique<DiscreteCpuMemory>(
        options_.device, options_.shared_host_memory ? options_.shared_host_min_bytes : 0);
    gate_ = memory.get();
    allocator_ = std::make_unique<Allocator>(std::move(memory), alloc_options);
  } else {
    auto memory = options_.shared_host_memory ? shared_cpu_memory(options_.device, options_.shared_host_min_bytes)
                                              : cpu_memory(options_.device);
    allocator_ = std::make_unique<Allocator>(std::move(memory), alloc_options);
  }
  scheduler_ = std::make_unique<Scheduler>(
      Scheduler::Options{.name = options_.name + "/rank" + std::to_string(options_.rank), .log = options_.log});
  scheduler_->start();
}

Runtime::~Runtime() { stop(); }

void Runtime::stop() {
  streams_.clear();  // each stream drains its queue, so recorded points complete
  if (scheduler_) scheduler_->stop();
  if (poller_) poller_->stop();
}

Stream& Runtime::stream(std::string_view name) {
  if (auto it = streams_.find(name); it != streams_.end()) return it->second;
  Stream s = options_.device.kind == DeviceKind::cuda
                 ? cuda::make_stream(options_.device, std::string(name), *poller_)
                 : Stream::cpu(options_.device, std::string(name), stream_options());
  return streams_.emplace(std::string(name), std::move(s)).first->second;
}

Stream::Options Runtime::stream_options() const noexcept {
  return {.telemetry = telemetry_,
          .rank = options_.rank,
          .jitter = options_.stream_jitter,
          .jitter_seed = static_cast<std::uint64_t>(options_.rank),
          .gate = gate_};
}

std::uint64_t Runtime::add_diagnostic(std::function<void()> write) {
  std::lock_guard lock(diagnostics_m_);
  diagnostics_.emplace(next_diagnostic_, std::move(write));
  return next_diagnostic_++;
}

void Runtime::remove_diagnostic(std::uint64_t id) noexcept {
  std::lock_guard lock(diagnostics_m_);
  diagnostics_.erase(id);
}

void Runtime::write_diagnostics() noexcept {
  std::lock_guard lock(diagnostics_m_);
  for (auto& [id, write] : diagnostics_) {
    try {
      write();
    } catch (...) {
      // a diagnostic that fails must not keep the others from being written
    }
  }
}

}  // namespace coshard
