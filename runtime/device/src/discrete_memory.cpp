#include "coshard/runtime/discrete_memory.hpp"

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/shared_memory.hpp"
#include "page_size.hpp"

namespace coshard {
namespace {

// The SIGSEGV handler can reach nothing but process-wide state, and may only read it without
// locks: a fixed table of the discrete regions of every DiscreteCpuMemory in the process.
struct FaultTable {
  struct Slot {
    std::atomic<std::uintptr_t> begin{0};
    std::atomic<std::uintptr_t> end{0};  // 0 while the slot is being filled or emptied
  };
  static constexpr std::size_t kSlots = 8192;  // a rank holds hundreds of blocks, not thousands
  std::array<Slot, kSlots> slots;
  struct sigaction previous {};
};

FaultTable* g_table = nullptr;  // set once, never freed: a fault may come during exit
std::once_flag g_install;

void write_all(const char* s, std::size_t n) noexcept {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

extern "C" void on_device_fault(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (auto& slot : g_table->slots) {
    const std::uintptr_t end = slot.end.load(std::memory_order_acquire);
    const std::uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (end == 0 || addr < begin || addr >= end) continue;
    char msg[512];
    const int n = std::snprintf(msg, sizeof msg,
                                "coshard: host access to cpu-discrete device memory at %p (byte %zu of a %zu-byte "
                                "region at %p) while no stream work ran. Device memory is read and written only by "
                                "work enqueued on a stream (kernels, copies): enqueue the access, or copy the "
                                "values to host memory on a stream and await its event. The access:\n",
                                info->si_addr, static_cast<std::size_t>(addr - begin),
                                static_cast<std::size_t>(end - begin), reinterpret_cast<void*>(begin));
    write_all(msg, static_cast<std::size_t>(n > 0 ? std::min<int>(n, sizeof msg - 1) : 0));
    void* frames[48];
    ::backtrace_symbols_fd(frames, ::backtrace(frames, 48), STDERR_FILENO);
    std::abort();
  }
  // Not device memory: whoever handled SIGSEGV before us decides (a sanitizer, or the default).
  const struct sigaction& prev = g_table->previous;
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
    prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  } else {
    ::signal(SIGSEGV, SIG_DFL);  // the access runs again on return and kills the process as usual
  }
}

void install_fault_handler() {
  std::call_once(g_install, [] {
    g_table = new FaultTable;
    void* warm[1];
    ::backtrace(warm, 1);  // loads libgcc now: the handler's first backtrace() must not malloc
    struct sigaction sa {};
    sa.sa_sigaction = on_device_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGSEGV, &sa, &g_table->previous);
  });
}

void table_add(void* p, std::size_t size) noexcept {
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  for (auto& slot : g_table->slots) {
    std::uintptr_t none = 0;
    if (slot.begin.compare_exchange_strong(none, begin, std::memory_order_acq_rel)) {
      slot.end.store(begin + size, std::memory_order_release);
      return;
    }
  }
  // Full: the region is still protected; a fault there is reported as a plain SIGSEGV.
}

void table_remove(void* p) noexcept {
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  for (auto& slot : g_table->slots) {
    if (slot.begin.load(std::memory_order_acquire) == begin && slot.end.load(std::memory_order_acquire) != 0) {
      slot.end.store(0, std::memory_order_release);
      slot.begin.store(0, std::memory_order_release);
      return;
    }
  }
}

[[noreturn]] void protect_failed(void* p, std::size_t size, int prot) noexcept {
  char msg[256];
  const int n = std::snprintf(msg, sizeof msg, "coshard: mprotect(%p, %zu, %s) of cpu-discrete device memory failed: %s\n",
                              p, size, prot == PROT_NONE ? "PROT_NONE" : "PROT_READ|PROT_WRITE", std::strerror(errno));
  write_all(msg, static_cast<std::size_t>(n > 0 ? std::min<int>(n, sizeof msg - 1) : 0));
  std::abort();  // the mode would silently stop proving anything
}

}  // namespace

DiscreteCpuMemory::DiscreteCpuMemory(Device device, std::size_t shared_min_bytes)
    : device_(device), shared_min_bytes_(shared_min_bytes) {
  if (shared_min_bytes_ > 0) shared_ = shared_cpu_memory(device, shared_min_bytes_);
  install_fault_handler();
}

DiscreteCpuMemory::~DiscreteCpuMemory() {
  std::lock_guard lock(m_);
  for (auto& [p, r] : regions_) {  // leaked buffers: unmap anyway, the memory resource is gone
    table_remove(p);
    if (r.segment) {
      shared_->deallocate(p, r.size);
    } else {
      ::munmap(p, r.size);
    }
  }
}

void* DiscreteCpuMemory::allocate(std::size_t bytes) {
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + detail::page_size() - 1) / detail::page_size() * detail::page_size();
  std::lock_guard lock(m_);
  const int prot = open_ > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
  void* p = nullptr;
  bool segment = false;
  if (shared_ && bytes >= shared_min_bytes_) {
    p = shared_->allocate(bytes);
    SegmentRef ref;
    if (shared_segment_of(p, bytes, &ref) && ref.offset == 0) {
      segment = true;
      if (::mprotect(p, size, prot) != 0) protect_failed(p, size, prot);
    } else {
      shared_->deallocate(p, bytes);  // a heap fallback shares pages with other data: map our own
      p = nullptr;
    }
  }
  if (!p) {
    p = ::mmap(nullptr, size, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      throw Error(Errc::out_of_memory, "mapping " + std::to_string(size) + " bytes of cpu-discrete memory on " +
                                           device_.to_string() + " failed: " + std::strerror(errno));
    }
  }
  regions_.emplace(p, Region{size, segment});
  table_add(p, size);
  return p;
}

void DiscreteCpuMemory::deallocate(void* p, std::size_t bytes) noexcept {
  Region r;
  {
    std::lock_guard lock(m_);
    auto it = regions_.find(p);
    if (it == regions_.end()) return;
    r = it->second;
    regions_.erase(it);
    table_remove(p);
  }
  if (r.segment) {
    shared_->deallocate(p, bytes);
  } else {
    ::munmap(p, r.size);
  }
}

void DiscreteCpuMemory::open() noexcept {
  std::lock_guard lock(m_);
  if (open_++ == 0) protect_all(PROT_READ | PROT_WRITE);
}

void DiscreteCpuMemory::close() noexcept {
  std::lock_guard lock(m_);
  if (--open_ == 0) protect_all(PROT_NONE);
}

bool DiscreteCpuMemory::is_open() const {
  std::lock_guard lock(m_);
  return open_ > 0;
}

void DiscreteCpuMemory::protect_all(int prot) noexcept {
  for (auto& [p, r] : regions_) {
    if (::mprotect(p, r.size, prot) != 0) protect_failed(p, r.size, prot);
  }
}

}  // namespace coshard
