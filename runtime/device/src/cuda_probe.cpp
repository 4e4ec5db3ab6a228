#include <cstdio>
#include <cstdlib>
#include <string>

#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/error.hpp"

#ifdef COSHARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace coshard::cuda {
namespace {
// Which host work this thread runs (null: none). Per thread by nature: a host callback runs on
// CUDA's callback thread, and the check must see that thread's state, not another's.
thread_local const std::string* t_stream = nullptr;
thread_local const std::string* t_span = nullptr;
}  // namespace

bool in_host_callback() noexcept { return t_stream != nullptr; }

void check_callable(const char* call) noexcept {
  if (!t_stream) return;
  std::fprintf(stderr,
               "coshard: CUDA call %s from host work '%s' on stream '%s': host work enqueued on a CUDA stream runs "
               "as a host callback, which must not call CUDA. Enqueue kernels and copies on the stream instead, and "
               "await an event for what the host needs\n",
               call, t_span->c_str(), t_stream->c_str());
  std::abort();
}

HostCallbackScope::HostCallbackScope(const std::string& stream, const std::string& span) noexcept
    : previous_stream_(t_stream), previous_span_(t_span) {
  t_stream = &stream;
  t_span = &span;
}

HostCallbackScope::~HostCallbackScope() {
  t_stream = previous_stream_;
  t_span = previous_span_;
}

Probe probe() {
#ifdef COSHARD_HAVE_CUDA
  int n = 0;
  check_callable("cudaGetDeviceCount");
  cudaError_t e = cudaGetDeviceCount(&n);  // leaves n untouched on failure (35 without a driver)
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it where the error is not sticky
    return {0, std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"};
  }
  if (n <= 0) return {0, "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)"};
  return {n, {}};
#else
  return {0, "coshard was built without CUDA (COSHARD_CUDA=OFF or no toolkit found)"};
#endif
}

#ifndef COSHARD_HAVE_CUDA
namespace {
[[noreturn]] void no_cuda() {
  throw Error(Errc::bad_config, "coshard was built without CUDA: rebuild with -DCOSHARD_CUDA=ON to use CUDA devices");
}
}  // namespace
struct EventPoller::Impl {};
EventPoller::EventPoller(Device) { no_cuda(); }
EventPoller::EventPoller(Device, Options) { no_cuda(); }
EventPoller::~EventPoller() = default;
void EventPoller::start() { no_cuda(); }
void EventPoller::stop() {}
Stream make_stream(Device, std::string, EventPoller&) { no_cuda(); }
std::unique_ptr<MemoryResource> device_memory(Device) { no_cuda(); }
void copy_async(Stream&, void*, const void*, std::size_t) { no_cuda(); }
bool pinned(const void*) { return false; }
void copy_to_device_async(Stream&, void*, const void*, std::size_t, std::shared_ptr<const void>, std::string) {
  no_cuda();
}
void copy_to_host_async(Stream&, void*, const void*, std::size_t, std::shared_ptr<void>, std::string) { no_cuda(); }
std::unique_ptr<MemoryResource> pinned_host_memory(std::function<void(const std::string&)>) { no_cuda(); }
std::unique_ptr<MemoryResource> pinned_host_memory() { no_cuda(); }
void memset_async(Stream&, void*, int, std::size_t) { no_cuda(); }
void use_device(Device) { no_cuda(); }
#endif

}  // namespace coshard::cuda
