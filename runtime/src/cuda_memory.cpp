#include "coshard/runtime/cuda.hpp"
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
}  // namespace

std::unique_ptr<MemoryResource> device_memory(Device device) {
  if (device.kind != DeviceKind::cuda) {
    throw Error(Errc::invalid_argument, "cuda::device_memory needs a CUDA device, got " + device.to_string());
  }
  return std::make_unique<CudaMemory>(device);
}
}  // namespace coshard::cuda
