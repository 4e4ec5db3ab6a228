#pragma once
// A CPU device whose memory behaves like a GPU's: the host cannot read or write it, only work that
// runs on the device's streams can. Code that dereferences device memory on the host (a fill, a
// copy, a state dict read) then fails at that access, on a machine without a GPU, instead of
// working by accident on the CPU device and faulting on the first CUDA run.
//
// How: every allocation is a page-aligned mapping of its own, kept PROT_NONE while no stream work
// runs. A CPU stream's worker opens the MemoryGate while it has work to run (and closes it before
// it blocks on a wait or an empty queue), which makes every region readable and writable. A fault
// in a closed region prints "host access to cpu-discrete device memory" with the address and a
// backtrace of the access, then aborts.
//
// The limit: protection is per process, not per thread (this kernel offers no per-thread keys on
// these machines), so a host access made while some stream is busy is not caught. Accesses made
// while the streams are idle are all caught: Engine::create, state dicts, checkpoints, anything
// after a synchronisation. Stream jitter widens the idle gaps between work items.
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "coshard/runtime/allocator.hpp"

namespace coshard {

/// Opens device memory to the threads that run stream work, from open() to the matching close().
/// Calls nest (several streams at once); thread-safe.
class MemoryGate {
 public:
  virtual ~MemoryGate() = default;
  virtual void open() noexcept = 0;   ///< device memory is accessible until the matching close()
  virtual void close() noexcept = 0;  ///< ends one open(); the memory closes when none is left
};

/// Discrete CPU device memory (see the top of this header): a MemoryResource and the gate that its
/// streams open. Allocations of at least `shared_min_bytes` are shared-memory segments
/// (shared_memory.hpp) so that local peers can still map them for single-copy collectives; 0: none.
class DiscreteCpuMemory final : public MemoryResource, public MemoryGate {
 public:
  /// Memory of `device`; allocations of at least `shared_min_bytes` are shared segments (0: none).
  DiscreteCpuMemory(Device device, std::size_t shared_min_bytes);
  DiscreteCpuMemory(const DiscreteCpuMemory&) = delete;
  DiscreteCpuMemory& operator=(const DiscreteCpuMemory&) = delete;
  ~DiscreteCpuMemory() override;  ///< every allocation must have been given back

  Device device() const noexcept override { return device_; }
  bool host_accessible() const noexcept override { return false; }  ///< only stream work reaches it
  void* allocate(std::size_t bytes) override;
  void deallocate(void* p, std::size_t bytes) noexcept override;
  void open() noexcept override;
  void close() noexcept override;

  /// Whether device memory is accessible now (some stream work holds the gate); for tests.
  bool is_open() const;

 private:
  struct Region {
    std::size_t size = 0;  // mapped bytes (whole pages)
    bool segment = false;  // from `shared_`, else an anonymous mapping of ours
  };
  void protect_all(int prot) noexcept;

  Device device_;
  std::size_t shared_min_bytes_;
  std::unique_ptr<MemoryResource> shared_;  // shared_cpu_memory(), for segments
  mutable std::mutex m_;
  std::map<void*, Region> regions_;
  int open_ = 0;  // open() calls not yet closed
};

}  // namespace coshard
