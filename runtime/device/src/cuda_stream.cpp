// CUDA backend: RAII stream and event wrappers, and the event poller service. Completions are
// observed by polling cudaEventQuery on the poller's thread (never from a CUDA host callback) and
// handed to waiters, which post to their scheduler.
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <list>
#include <mutex>
#include <thread>

#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/log.hpp"
#include "cuda_check.hpp"

namespace coshard::cuda {
namespace {

class CudaCompletion final : public coshard::detail::Completion,
                             public std::enable_shared_from_this<CudaCompletion> {
 public:
  CudaCompletion(Device d, cudaStream_t s, EventPoller& poller) : device_(d), poller_(poller) {
    COSHARD_CUDA_CHECK(cudaSetDevice(d.index));
    COSHARD_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    COSHARD_CUDA_CHECK(cudaEventRecord(event_, s));
  }
  ~CudaCompletion() override { cudaEventDestroy(event_); }
  CudaCompletion(const CudaCompletion&) = delete;
  CudaCompletion& operator=(const CudaCompletion&) = delete;

  bool ready() const override {
    cudaError_t e = cudaEventQuery(event_);
    return e != cudaErrorNotReady;
  }
  std::exception_ptr error() const override {
    cudaError_t e = cudaEventQuery(event_);
    if (e == cudaSuccess || e == cudaErrorNotReady) return nullptr;
    return std::make_exception_ptr(Error(Errc::device, std::string("work before a CUDA event on ") +
                                                           device_.to_string() + " failed: " + cudaGetErrorName(e) +
                                                           " (" + cudaGetErrorString(e) + ")"));
  }
  void notify(std::shared_ptr<coshard::detail::Waiter> w) override;
  bool block_until_ready(std::chrono::nanoseconds limit) override {
    auto deadline = std::chrono::steady_clock::now() + limit;
    auto pause = std::chrono::microseconds(5);
    while (!ready()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    return true;
  }
  cudaEvent_t event() const noexcept { return event_; }

 private:
  Device device_;
  EventPoller& poller_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace

struct EventPoller::Impl {
  Device device;
  Options options;
  std::mutex m;
  std::condition_variable cv;
  bool stopping = false;
  std::list<std::pair<std::shared_ptr<CudaCompletion>, std::shared_ptr<coshard::detail::Waiter>>> watched;
  std::thread thread;

  void watch(std::shared_ptr<CudaCompletion> c, std::shared_ptr<coshard::detail::Waiter> w) {
    {
      std::lock_guard lock(m);
      watched.emplace_back(std::move(c), std::move(w));
    }
    cv.notify_one();
  }

  void run() {
    cudaSetDevice(device.index);
    auto pause = options.min_backoff;
    std::unique_lock lock(m);
    for (;;) {
      cv.wait(lock, [&] { return stopping || !watched.empty(); });
      if (stopping) break;
      bool progressed = false;
      for (auto it = watched.begin(); it != watched.end();) {
        if (it->first->ready() || !it->second->pending()) {
          auto entry = std::move(*it);
          it = watched.erase(it);
          lock.unlock();
          entry.second->complete(entry.first->error());
          lock.lock();
          progressed = true;
        } else {
          ++it;
        }
      }
      if (progressed) {
        pause = options.min_backoff;
      } else {
        cv.wait_for(lock, pause, [&] { return stopping; });
        pause = std::min(pause * 2, options.max_backoff);
      }
    }
    // Waiters still pending at shutdown get an error instead of hanging.
    for (auto& [c, w] : watched) {
      w->complete(std::make_exception_ptr(Error(Errc::cancelled, "CUDA event poller stopped before the event completed")));
    }
    watched.clear();
  }
};

void CudaCompletion::notify(std::shared_ptr<coshard::detail::Waiter> w) {
  if (ready()) {
    w->complete(error());
    return;
  }
  poller_.impl().watch(shared_from_this(), std::move(w));
}


namespace {

class CudaStream final : public coshard::detail::StreamImpl {
 public:
  CudaStream(Device d, std::string name, EventPoller& poller) : device_(d), name_(std::move(name)), poller_(poller) {
    COSHARD_CUDA_CHECK(cudaSetDevice(d.index));
    COSHARD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaStream() override {
    cudaSetDevice(device_.index);
    cudaStreamSynchronize(stream_);
    if (staging_) cudaFreeHost(staging_);
    cudaStreamDestroy(stream_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  Device device() const noexcept override { return device_; }
  const std::string& name() const noexcept override { return name_; }
  std::shared_ptr<coshard::detail::Completion> record() override {
    return std::make_shared<CudaCompletion>(device_, stream_, poller_);
  }
  void wait(std::shared_ptr<coshard::detail::Completion> c) override {
    auto* cc = dynamic_cast<CudaCompletion*>(c.get());
    if (!cc) throw Error(Errc::invalid_argument, "CUDA stream '" + name_ + "' cannot wait on a non-CUDA event");
    COSHARD_CUDA_CHECK(cudaSetDevice(device_.index));
    COSHARD_CUDA_CHECK(cudaStreamWaitEvent(stream_, cc->event(), 0));
  }
  void enqueue(std::function<void()> work, std::string span) override {
    // Host work in stream order, as a host callback: it must not call CUDA (check_callable aborts
    // a coshard CUDA call made there), and an exception cannot leave it, so it ends the process
    // naming the work instead of an anonymous std::terminate.
    struct HostWork {
      std::function<void()> fn;
      std::string stream, span;
    };
    check_callable("cudaLaunchHostFunc");
    auto* fn = new HostWork{std::move(work), name_, span.empty() ? std::string("unnamed") : std::move(span)};
    cudaError_t e = cudaLaunchHostFunc(
        stream_,
        [](void* p) {
          auto* w = static_cast<HostWork*>(p);
          // The names move out (no allocation that could throw here): they outlive the work, whose
          // captures' destructors run inside the scope too.
          const std::string stream = std::move(w->stream), name = std::move(w->span);
          HostCallbackScope scope(stream, name);
          try {
            std::unique_ptr<HostWork> owned(w);
            owned->fn();
          } catch (const std::exception& ex) {
            std::fprintf(stderr, "coshard: host work '%s' on CUDA stream '%s' threw: %s\n", name.c_str(),
                         stream.c_str(), ex.what());
            std::abort();
          } catch (...) {
            std::fprintf(stderr, "coshard: host work '%s' on CUDA stream '%s' threw\n", name.c_str(), stream.c_str());
            std::abort();
          }
        },
        fn);
    if (e != cudaSuccess) {
      delete fn;
      COSHARD_CUDA_CHECK(e);
    }
  }
  void* native() noexcept override { return stream_; }

  // The stream's own pinned buffer for copies from and to pageable memory (kStagingBytes, made on
  // first use); null when pinning failed, once and for all (the copies then block instead). The
  // caller holds `lock` while it enqueues its chunks: chunks of two threads' copies interleaved
  // in the stream would overwrite each other's staged bytes.
  void* staging(std::unique_lock<std::mutex>& lock) {
    lock = std::unique_lock(staging_m_);
    if (!staging_ && !staging_failed_) {
      COSHARD_CUDA_CHECK(cudaSetDevice(device_.index));
      if (cudaHostAlloc(&staging_, kStagingBytes, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();  // not sticky: clear it
        staging_ = nullptr;
        staging_failed_ = true;
        log_to_stderr(LogLevel::warning, "no pinned staging buffer for CUDA stream '" + name_ +
                                             "': its copies from and to pageable memory block the calling thread");
      }
    }
    return staging_;
  }

 private:
  Device device_;
  std::string name_;
  EventPoller& poller_;
  cudaStream_t stream_ = nullptr;
  std::mutex staging_m_;
  void* staging_ = nullptr;
  bool staging_failed_ = false;
};

}  // namespace

EventPoller::EventPoller(Device device) : EventPoller(device, Options{}) {}
EventPoller::EventPoller(Device device, Options options) : impl_(std::make_unique<Impl>()) {
  if (device.kind != DeviceKind::cuda) {
    throw Error(Errc::invalid_argument, "EventPoller needs a CUDA device, got " + device.to_string());
  }
  impl_->device = device;
  impl_->options = options;
}
EventPoller::~EventPoller() { stop(); }
void EventPoller::start() {
  if (impl_->thread.joinable()) return;
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}
void EventPoller::stop() {
  {
    std::lock_guard lock(impl_->m);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Stream make_stream(Device device, std::string name, EventPoller& poller) {
  if (device.kind != DeviceKind::cuda) {
    throw Error(Errc::invalid_argument, "cuda::make_stream needs a CUDA device, got " + device.to_string());
  }
  return Stream(std::make_unique<CudaStream>(device, std::move(name), poller));
}

namespace {
cudaStream_t native_of(Stream& stream, const char* what) {
  if (stream.device().kind != DeviceKind::cuda) {
    throw Error(Errc::invalid_argument, std::string(what) + " needs a CUDA stream, got '" + stream.name() + "' on " +
                                            stream.device().to_string());
  }
  COSHARD_CUDA_CHECK(cudaSetDevice(stream.device().index));
  return static_cast<cudaStream_t>(stream.impl().native());
}
}  // namespace

void copy_async(Stream& stream, void* dst, const void* src, std::size_t bytes) {
  COSHARD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, native_of(stream, "cuda::copy_async")));
}

bool pinned(const void* host) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, host) != cudaSuccess) {
    cudaGetLastError();  // an unknown pointer is pageable memory: not an error to keep
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

namespace {

// The pinned staging buffer of CUDA `stream`, held through `lock`, or null: pinned host memory (no
// staging needed), or none could be made.
void* staging_for(Stream& stream, const void* host, std::unique_lock<std::mutex>& lock) {
  if (pinned(host)) return nullptr;
  auto* impl = dynamic_cast<CudaStream*>(&stream.impl());
  return impl ? impl->staging(lock) : nullptr;
}

}  // namespace

void copy_to_device_async(Stream& stream, void* dst, const void* host, std::size_t bytes,
                          std::shared_ptr<const void> keep, std::string span) {
  std::unique_lock<std::mutex> lock;
  void* stage = staging_for(stream, host, lock);
  if (!stage) {
    copy_async(stream, dst, host, bytes);
    stream.enqueue([keep = std::move(keep)] {}, std::move(span));  // the host bytes live until the copy is past
    return;
  }
  // One buffer serves every chunk: in stream order, a chunk's callback fills it only after the
  // previous chunk's DMA read it.
  for (std::size_t at = 0; at < bytes; at += kStagingBytes) {
    const std::size_t n = std::min(kStagingBytes, bytes - at);
    const auto* from = static_cast<const std::byte*>(host) + at;
    stream.enqueue([stage, from, n, keep] { std::memcpy(stage, from, n); }, span);
    copy_async(stream, static_cast<std::byte*>(dst) + at, stage, n);
  }
}

void copy_to_host_async(Stream& stream, void* host, const void* src, std::size_t bytes, std::shared_ptr<void> keep,
                        std::string span) {
  std::unique_lock<std::mutex> lock;
  void* stage = staging_for(stream, host, lock);
  if (!stage) {
    copy_async(stream, host, src, bytes);
    stream.enqueue([keep = std::move(keep)] {}, std::move(span));
    return;
  }
  for (std::size_t at = 0; at < bytes; at += kStagingBytes) {
    const std::size_t n = std::min(kStagingBytes, bytes - at);
    auto* to = static_cast<std::byte*>(host) + at;
    copy_async(stream, stage, static_cast<const std::byte*>(src) + at, n);
    stream.enqueue([stage, to, n, keep] { std::memcpy(to, stage, n); }, span);
  }
}

void use_device(Device device) {
  if (device.kind != DeviceKind::cuda) {
    throw Error(Errc::invalid_argument, "cuda::use_device needs a CUDA device, got " + device.to_string());
  }
  COSHARD_CUDA_CHECK(cudaSetDevice(device.index));
}

void memset_async(Stream& stream, void* dst, int value, std::size_t bytes) {
  COSHARD_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, native_of(stream, "cuda::memset_async")));
}

}  // namespace coshard::cuda
