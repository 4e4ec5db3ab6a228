#include "coshard/runtime/copy.hpp"

#include <cstring>

#include "coshard/runtime/cuda.hpp"

namespace coshard {
namespace {

// A tensor may be of the stream's device, or host memory on a CUDA stream (offloaded state).
void check_device(const char* what, const Stream& stream, const Tensor& t) {
  const bool host_on_cuda = stream.device().kind == DeviceKind::cuda && t.device().kind == DeviceKind::cpu;
  if (t.device() != stream.device() && !host_on_cuda) {
    throw Error(Errc::invalid_argument, std::string(what) + ": the tensor is on " + t.device().to_string() +
                                            " but stream '" + stream.name() + "' on " + stream.device().to_string());
  }
}

void check(const char* what, const Stream& stream, const Tensor& t, std::size_t host_bytes) {
  if (!t.defined() || t.nbytes() != host_bytes) {
    throw Error(Errc::invalid_argument, std::string(what) + ": the tensor spans " + std::to_string(t.nbytes()) +
                                            " bytes but the host buffer " + std::to_string(host_bytes));
  }
  check_device(what, stream, t);
}

}  // namespace

void copy_to_device(Stream& stream, const Tensor& dst, const void* host, std::size_t bytes,
                    std::shared_ptr<const void> keep, std::string span) {
  check("copy_to_device", stream, dst, bytes);
  if (bytes == 0) return;
  if (dst.device().kind == DeviceKind::cuda) {
    cuda::copy_to_device_async(stream, dst.data(), host, bytes, std::move(keep), std::move(span));
    record_use(stream, {dst});
    return;
  }
  // Host memory, also on a CUDA stream (a host callback): a CUDA copy between two host buffers
  // would block the caller.
  stream.enqueue([dst, host, bytes, keep] { std::memcpy(dst.data(), host, bytes); }, std::move(span));
}

void copy_to_host(Stream& stream, const Tensor& src, void* host, std::size_t bytes, std::shared_ptr<void> keep,
                  std::string span) {
  check("copy_to_host", stream, src, bytes);
  if (bytes == 0) return;
  if (src.device().kind == DeviceKind::cuda) {
    cuda::copy_to_host_async(stream, host, src.data(), bytes, std::move(keep), std::move(span));
    record_use(stream, {src});
    return;
  }
  stream.enqueue([src, host, bytes, keep] { std::memcpy(host, src.data(), bytes); }, std::move(span));
}

void copy_to_host(Stream& stream, const Tensor& src, std::shared_ptr<std::vector<std::byte>> host, std::string span) {
  host->resize(src.nbytes());
  copy_to_host(stream, src, host->data(), host->size(), host, std::move(span));
}

void copy_tensor(Stream& stream, const Tensor& dst, const Tensor& src, std::string span) {
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel()) {
    throw Error(Errc::invalid_argument, "copy_tensor: " + std::to_string(src.numel()) + " elements of " +
                                            std::string(to_string(src.dtype())) + " into " +
                                            std::to_string(dst.numel()) + " of " + std::string(to_string(dst.dtype())));
  }
  if (dst.nbytes() == 0) return;
  check_device("copy_tensor", stream, dst);
  check_device("copy_tensor", stream, src);
  const bool to_cuda = dst.device().kind == DeviceKind::cuda, from_cuda = src.device().kind == DeviceKind::cuda;
  if (!to_cuda && !from_cuda) {  // host memory, also on a CUDA stream (a host callback)
    stream.enqueue([dst, src] { std::memmove(dst.data(), src.data(), dst.nbytes()); }, std::move(span));
    return;
  }
  const Tensor& host = to_cuda ? src : dst;
  if (to_cuda == from_cuda || cuda::pinned(host.data())) {  // one DMA
    cuda::copy_async(stream, dst.data(), src.data(), dst.nbytes());
    record_use(stream, {dst, src});
    return;
  }
  // Pageable host memory (pinning failed): through the stream's pinned buffer, never blocking.
  auto keep = std::make_shared<Tensor>(host);
  if (to_cuda) {
    cuda::copy_to_device_async(stream, dst.data(), src.data(), dst.nbytes(), std::move(keep), std::move(span));
    record_use(stream, {dst});
  } else {
    cuda::copy_to_host_async(stream, dst.data(), src.data(), dst.nbytes(), std::move(keep), std::move(span));
    record_use(stream, {src});
  }
}

void fill_zero(Stream& stream, const Tensor& dst, std::string span) {
  if (dst.nbytes() == 0) return;
  check_device("fill_zero", stream, dst);
  if (dst.device().kind == DeviceKind::cuda) {  // host memory (maybe pageable) is zeroed by host work
    cuda::memset_async(stream, dst.data(), 0, dst.nbytes());
    record_use(stream, {dst});
    return;
  }
  stream.enqueue([dst] { std::memset(dst.data(), 0, dst.nbytes()); }, std::move(span));
}

void record_use(Stream& stream, std::initializer_list<Tensor> tensors) {
  Event used(stream.device());
  used.record(stream);
  for (const Tensor& t : tensors) {
    if (t.defined()) t.record_use(used);
  }
}

}  // namespace coshard
