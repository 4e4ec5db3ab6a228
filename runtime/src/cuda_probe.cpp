#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/error.hpp"

#ifdef COSHARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace coshard::cuda {

Probe probe() {
#ifdef COSHARD_HAVE_CUDA
  int n = 0;
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
std::unique_ptr<MemoryResource> pinned_host_memory(std::function<void(const std::string&)>) { no_cuda(); }
std::unique_ptr<MemoryResource> pinned_host_memory() { no_cuda(); }
void memset_async(Stream&, void*, int, std::size_t) { no_cuda(); }
#endif

}  // namespace coshard::cuda
