#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/log.hpp"
#include "cuda_check.hpp"

namespace coshard::cuda {
namespace {
class CudaMemory final : public MemoryResource {
 public:
  explicit CudaMemory(Device d) : device_(d) {}
  Device device() const noexcept override { return device_; }
  void* allocate(std::size_t bytes) override {
    COSHARD_CUDA_CHECK(cudaSetDevice(device_.index));
    void* p = nullptr;
    COSHARD_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override {
    cudaSetDevice(device_.index);
    cudaFree(p);  // nothing to do about a failure while freeing
  }

 private:
  Device device_;
};

class PinnedHostMemory final : public MemoryResource {
 public:
  explicit PinnedHostMemory(std::function<void(const std::string&)> warn) : warn_(std::move(warn)) {}
  Device device() const noexcept override { return Device::cpu(); }
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    std::lock_guard lock(m_);
    if (e == cudaSuccess) {
      pinned_.insert(p);
      return p;
    }
    cudaGetLastError();  // not sticky: later CUDA calls must not see it
    if (!warned_) {
      warned_ = true;
      if (warn_) {
        warn_("pinning " + std::to_string(bytes) + " bytes of host memory failed (" + cudaGetErrorName(e) + ": " +
              cudaGetErrorString(e) + "); offloaded state uses ordinary host memory, so its copies to and from the "
              "device are synchronous. Raise RLIMIT_MEMLOCK (ulimit -l) or offload less");
      }
    }
    p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw Error(Errc::out_of_memory, "host allocation of " + std::to_string(bytes) + " bytes failed");
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override {
    bool pinned = false;
    {
      std::lock_guard lock(m_);
      pinned = pinned_.erase(p) > 0;
    }
    if (pinned) {
      cudaFreeHost(p);
    } else {
      std::free(p);
    }
  }

 private:
  std::function<void(const std::string&)> warn_;
  std::mutex m_;  // buffers are freed from stream threads
  std::set<void*> pinned_;
  bool warned_ = false;
};

}  // namespace

std::unique_ptr<MemoryResource> pinned_host_memory(std::function<void(const std::string&)> warn) {
  return std::make_unique<PinnedHostMemory>(std::move(warn));
}

std::unique_ptr<MemoryResource> pinned_host_memory() {
  return pinned_host_memory([](const std::string& why) { log_to_stderr(LogLevel::warning, why); });
}

std::unique_ptr<MemoryResource> device_memory(Device device) {
  if (device.kind != DeviceKind::cuda) {
    throw Error(Errc::invalid_argument, "cuda::device_memory needs a CUDA device, got " + device.to_string());
  }
  return std::make_unique<CudaMemory>(device);
}
}  // namespace coshard::cuda
