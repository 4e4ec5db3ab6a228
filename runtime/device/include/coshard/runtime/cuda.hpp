#pragma once
// CUDA backend entry points. The header has no CUDA includes so every build sees it; without
// CUDA support, probe() says so and the factories throw.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "coshard/runtime/allocator.hpp"
#include "coshard/runtime/stream.hpp"

namespace coshard::cuda {

/// What probe() found.
struct Probe {
  int devices = 0;     ///< visible CUDA devices
  std::string reason;  ///< why there is no usable device, when devices == 0
};
/// Asks the runtime how many devices there are. No driver, no device or a build without CUDA
/// all give 0 with the reason, never an exception.
Probe probe();

/// Polls recorded CUDA events with a bounded back-off and hands completions to their waiters
/// (which post to their scheduler). One per device; a service with start/stop.
class EventPoller {
 public:
  /// Polling pace: the pause starts at min_backoff after progress and doubles while idle.
  struct Options {
    std::chrono::microseconds min_backoff{5};    ///< pause after an event completed
    std::chrono::microseconds max_backoff{500};  ///< longest pause between polls
  };
  /// A stopped poller for CUDA `device` with default Options.
  explicit EventPoller(Device device);
  /// A stopped poller for CUDA `device`. Throws Error(invalid_argument) for a CPU device, and
  /// Error(bad_config) in a build without CUDA.
  EventPoller(Device device, Options options);
  EventPoller(const EventPoller&) = delete;
  EventPoller& operator=(const EventPoller&) = delete;
  ~EventPoller();  ///< calls stop()
  /// Starts the polling thread; a no-op when already running.
  void start();
  /// Joins the thread; pending waiters complete with Error(cancelled). Safe to call twice.
  void stop();
  struct Impl;
  /// The backend state, for the CUDA streams that register their events here.
  Impl& impl() noexcept { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

/// True while this thread runs host work enqueued on a CUDA stream (Stream::enqueue: a
/// cudaLaunchHostFunc callback), where CUDA must not be called: CUDA may deadlock or fail there.
bool in_host_callback() noexcept;
/// What every coshard CUDA call runs first (the COSHARD_CUDA_CHECK macros of runtime, ops and the
/// NCCL backend): inside host work it prints "CUDA call <call> from host work '<span>' on stream
/// '<stream>'" and aborts, naming the offender, instead of hanging the device.
void check_callable(const char* call) noexcept;
/// Marks the calling thread as running the host work `span` of `stream` until destroyed; the CUDA
/// streams' host callbacks run inside one. Nests.
class HostCallbackScope {
 public:
  /// `stream` and `span` must outlive the scope (they are named in the abort message).
  HostCallbackScope(const std::string& stream, const std::string& span) noexcept;
  ~HostCallbackScope();  ///< restores the enclosing scope, if any
  HostCallbackScope(const HostCallbackScope&) = delete;
  HostCallbackScope& operator=(const HostCallbackScope&) = delete;

 private:
  const std::string* previous_stream_;
  const std::string* previous_span_;
};

/// A non-blocking CUDA stream on `device` whose events complete through `poller`.
Stream make_stream(Device device, std::string name, EventPoller& poller);
/// Enqueues cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault) on CUDA `stream`: either side may
/// be host or device memory (unified addressing). Pageable host memory makes it synchronous.
void copy_async(Stream& stream, void* dst, const void* src, std::size_t bytes);
/// Whether `host` points into page-locked host memory (cudaHostAlloc or registered), which a DMA
/// reads and writes without blocking the caller. False for pageable memory and in a build without CUDA.
bool pinned(const void* host);
/// Bytes of a CUDA stream's pinned staging buffer: the chunk of copy_to_device_async and
/// copy_to_host_async from and to pageable memory.
inline constexpr std::size_t kStagingBytes = std::size_t{4} << 20;
/// Enqueues on CUDA `stream` the copy of `bytes` host bytes at `host` into device memory `dst`,
/// without blocking the calling thread: from pageable memory in chunks through the stream's own
/// pinned buffer, each chunk's host side copied by a host callback in stream order; from pinned
/// memory by one cudaMemcpyAsync. `keep` owns the host bytes until the copy has run. Where no
/// pinned buffer could be made (warned once per stream), copy_async: synchronous, but correct.
/// `host` must be host memory and `dst` device memory: between two host buffers, use host work.
void copy_to_device_async(Stream& stream, void* dst, const void* host, std::size_t bytes,
                          std::shared_ptr<const void> keep, std::string span);
/// The other way: device memory `src` into `bytes` host bytes at `host`, held by `keep`; the
/// bytes are there once the stream has passed this point.
void copy_to_host_async(Stream& stream, void* host, const void* src, std::size_t bytes, std::shared_ptr<void> keep,
                        std::string span);
/// Enqueues cudaMemsetAsync(dst, value, bytes) on CUDA `stream`.
void memset_async(Stream& stream, void* dst, int value, std::size_t bytes);
/// Makes `device` the calling thread's current CUDA device (cudaSetDevice): where the kernels and
/// library handles (cuBLAS) that the thread makes next go.
void use_device(Device device);
/// Page-locked host memory (cudaHostAlloc, portable to every device) for offloaded state and
/// staging, so that copies between it and a device run asynchronously and overlap compute. Put a
/// caching Allocator over it: pinning is slow, reuse is not. When pinning fails (no driver,
/// RLIMIT_MEMLOCK, the system's pinned memory exhausted) the allocation comes from ordinary host
/// memory instead and `warn` is called, once per resource, with the reason: copies from such
/// memory are synchronous, but correct. Throws Error(bad_config) in a build without CUDA.
std::unique_ptr<MemoryResource> pinned_host_memory(std::function<void(const std::string&)> warn);
/// pinned_host_memory() warning on stderr.
std::unique_ptr<MemoryResource> pinned_host_memory();
/// cudaMalloc-backed memory for the caching Allocator.
std::unique_ptr<MemoryResource> device_memory(Device device);

}  // namespace coshard::cuda
