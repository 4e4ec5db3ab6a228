#pragma once
// Small stream-ordered scratch buffers (device error flags, reduction partials) for the ops that
// need a few bytes between kernels: cudaMallocAsync on the op's stream, cudaFreeAsync on the same
// stream when the scope ends, so the host never waits for them.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuda_check.hpp"

namespace coshard::ops::cuda::detail {

template <class T>
class StreamScratch {
 public:
  StreamScratch(std::size_t count, cudaStream_t s) : stream_(s) {
    void* p = nullptr;
    COSHARD_OPS_CUDA_CHECK(cudaMallocAsync(&p, (count == 0 ? 1 : count) * sizeof(T), s));
    ptr_ = static_cast<T*>(p);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() { cudaFreeAsync(ptr_, stream_); }  // nothing to do about a failure while freeing
  T* get() const noexcept { return ptr_; }

 private:
  T* ptr_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace coshard::ops::cuda::detail
