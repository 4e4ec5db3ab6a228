#pragma once
// Copies between host memory and device tensors, as stream work. The engine and the units never
// dereference device memory on the host (it is not host memory on CUDA, nor on the cpu-discrete
// device): what the host writes goes in with upload(), what it reads comes back with download(),
// each ordered on a stream like any kernel.
//
//   upload(stream, ids, std::vector<std::int32_t>{...});        // returns at once
//   std::vector<float> v = co_await download<float>(stream, t);  // resumes once the copy ran
//
// Tensors from any allocator may take part (device memory, or host memory such as offloaded
// state, also on a CUDA stream): the copy runs as stream work either way.
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "coshard/runtime/stream.hpp"
#include "coshard/runtime/task.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard {

/// Enqueues on `stream` the copy of `bytes` host bytes at `host` into `dst` (the whole view; the
/// sizes must match, or Error(invalid_argument)); `keep` owns them until the copy has run.
void copy_to_device(Stream& stream, const Tensor& dst, const void* host, std::size_t bytes,
                    std::shared_ptr<const void> keep, std::string span);
/// Enqueues on `stream` the copy of `src` (the whole view) into the `bytes` host bytes at `host`
/// (the sizes must match); `keep` owns them until the copy has run.
void copy_to_host(Stream& stream, const Tensor& src, void* host, std::size_t bytes, std::shared_ptr<void> keep,
                  std::string span);
/// Enqueues on `stream` the copy of `src` (the whole view) into `host`, resized to fit; `host`
/// holds the bytes once the stream has passed this point (await an event recorded after it). On
/// CUDA the bytes pass through the stream's pinned staging buffer (cuda::copy_to_host_async), so
/// the call returns at once there too.
void copy_to_host(Stream& stream, const Tensor& src, std::shared_ptr<std::vector<std::byte>> host,
                  std::string span = {});
/// Enqueues on `stream` the copy of `src` into `dst`: same dtype and element count, either may be
/// device or host memory (a host tensor from another allocator, e.g. offloaded state).
void copy_tensor(Stream& stream, const Tensor& dst, const Tensor& src, std::string span = {});
/// Enqueues on `stream` the zeroing of `dst`'s bytes.
void fill_zero(Stream& stream, const Tensor& dst, std::string span = {});

/// Makes the work enqueued on `stream` so far a use of each tensor: their blocks go back into use
/// only once it has run (Tensor::record_use), without host work on the stream. How device work on
/// CUDA keeps its tensors (a host callback per kernel would stall the stream on the host).
void record_use(Stream& stream, std::initializer_list<Tensor> tensors);

/// Enqueues the copy of `values` into `dst` (element type must match its dtype); the values are
/// moved into the work, not copied again.
template <class T>
void upload(Stream& stream, const Tensor& dst, std::vector<T> values, std::string span = {}) {
  if (dtype_of<T>() != dst.dtype()) (void)dst.data_as<T>();  // throws the dtype mismatch
  auto held = std::make_shared<const std::vector<T>>(std::move(values));
  copy_to_device(stream, dst, held->data(), held->size() * sizeof(T), held, std::move(span));
}

/// The values of `src` once the work enqueued on `stream` before it has run (its error rethrown).
/// No default arguments here: GCC 12 destroys a coroutine's defaulted temporaries twice.
template <class T>
Task<std::vector<T>> download(Stream& stream, Tensor src) {
  if (dtype_of<T>() != src.dtype()) (void)src.data_as<T>();  // throws the dtype mismatch
  auto bytes = std::make_shared<std::vector<std::byte>>();
  copy_to_host(stream, src, bytes, "download");
  Event done(stream.device());
  done.record(stream);
  co_await done;
  std::vector<T> out(bytes->size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes->data(), bytes->size());
  co_return out;
}

}  // namespace coshard
