#include "coshard/runtime/shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/unique_fd.hpp"
#include "page_size.hpp"

namespace coshard {
namespace {

// An owned mapping.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* base, std::size_t size) noexcept : base_(base), size_(size) {}
  Mapping(Mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      base_ = std::exchange(o.base_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { reset(); }
  void* get() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  void reset() noexcept {
    if (base_) ::munmap(base_, size_);
    base_ = nullptr;
    size_ = 0;
  }

 private:
  void* base_ = nullptr;
  std::size_t size_ = 0;
};

struct Segment {
  UniqueFd fd;
  Mapping mapping;
  std::uint64_t id = 0;
  std::uint64_t inode = 0;
};

// Every shared segment of this process, by base address. Allocations come from any thread
// (stream workers free buffers), so the registry is locked; lookups are per collective, not per
// element.
struct Registry {
  std::mutex m;
  std::map<std::uintptr_t, Segment> segments;
  std::atomic<std::uint64_t> next_id{1};
  std::atomic<std::size_t> live{0};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: buffers may be freed during exit
  return *r;
}

// Raises the soft descriptor limit to the hard one (every segment holds a descriptor) and
// returns how many segments may be live: half the limit, the rest is left to sockets and files.
std::size_t segment_budget() {
  static const std::size_t budget = [] {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return std::size_t{256};
    if (rl.rlim_cur < rl.rlim_max) {
      rlimit raised = rl;
      raised.rlim_cur = rl.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
    }
    const rlim_t cur = rl.rlim_cur == RLIM_INFINITY ? rlim_t{1} << 20 : rl.rlim_cur;
    return static_cast<std::size_t>(cur / 2);
  }();
  return budget;
}

void* heap_allocate(const Device& device, std::size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    throw Error(Errc::out_of_memory,
                "host allocation of " + std::to_string(bytes) + " bytes failed on " + device.to_string());
  }
  return p;
}

// A new segment of at least `bytes`, or nullptr when no memfd can be had (the caller then uses
// the heap). Throws only when the memory itself cannot be mapped.
void* segment_allocate(const Device& device, std::size_t bytes) {
  Registry& reg = registry();
  if (reg.live.load(std::memory_order_relaxed) >= segment_budget()) return nullptr;
  const std::uint64_t id = reg.next_id.fetch_add(1);
  const std::string name = "coshard-seg-" + std::to_string(id);
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC));
  if (!fd) return nullptr;
  const std::size_t size = (bytes + detail::page_size() - 1) / detail::page_size() * detail::page_size();
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return nullptr;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return nullptr;
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    throw Error(Errc::out_of_memory, "mapping a shared host segment of " + std::to_string(size) + " bytes on " +
                                         device.to_string() + " failed: " + std::strerror(errno));
  }
  Segment seg;
  seg.fd = std::move(fd);
  seg.mapping = Mapping(base, size);
  seg.id = id;
  seg.inode = static_cast<std::uint64_t>(st.st_ino);
  std::lock_guard lock(reg.m);
  reg.segments.emplace(reinterpret_cast<std::uintptr_t>(base), std::move(seg));
  reg.live.fetch_add(1, std::memory_order_relaxed);
  return base;
}

// True when `p` was a segment (now unmapped and closed).
bool segment_free(void* p) noexcept {
  Registry& reg = registry();
  Segment gone;
  {
    std::lock_guard lock(reg.m);
    auto it = reg.segments.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == reg.segments.end()) return false;
    gone = std::move(it->second);
    reg.segments.erase(it);
    reg.live.fetch_sub(1, std::memory_order_relaxed);
  }
  return true;  // `gone` unmaps and closes outside the lock
}

class SharedCpuMemory final : public MemoryResource {
 public:
  SharedCpuMemory(Device d, std::size_t min_bytes) : device_(d), min_bytes_(min_bytes) { segment_budget(); }
  Device device() const noexcept override { return device_; }
  void* allocate(std::size_t bytes) override {
    if (bytes >= min_bytes_) {
      if (void* p = segment_allocate(device_, bytes)) return p;
    }
    return heap_allocate(device_, bytes);
  }
  void deallocate(void* p, std::size_t) noexcept override {
    if (!segment_free(p)) std::free(p);
  }

 private:
  Device device_;
  std::size_t min_bytes_;
};

}  // namespace

std::unique_ptr<MemoryResource> shared_cpu_memory(Device device, std::size_t min_bytes) {
  return std::make_unique<SharedCpuMemory>(device, min_bytes);
}

bool shared_segment_of(const void* p, std::size_t bytes, SegmentRef* out) noexcept {
  Registry& reg = registry();
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(reg.m);
  auto it = reg.segments.upper_bound(at);
  if (it == reg.segments.begin()) return false;
  --it;
  const Segment& seg = it->second;
  const std::uintptr_t offset = at - it->first;
  if (offset >= seg.mapping.size() || bytes > seg.mapping.size() - offset) return false;
  if (out) {
    out->pid = static_cast<std::int32_t>(::getpid());
    out->fd = seg.fd.get();
    out->id = seg.id;
    out->size = seg.mapping.size();
    out->inode = seg.inode;
    out->offset = offset;
  }
  return true;
}

std::size_t shared_segment_count() noexcept { return registry().live.load(); }

PeerMapping::PeerMapping(PeerMapping&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), size_(std::exchange(o.size_, 0)) {}

PeerMapping& PeerMapping::operator=(PeerMapping&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(base_, size_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

PeerMapping::~PeerMapping() {
  if (base_) ::munmap(base_, size_);
}

PeerMapping PeerMapping::map(const SegmentRef& ref) {
  const std::string path = "/proc/" + std::to_string(ref.pid) + "/fd/" + std::to_string(ref.fd);
  auto fail = [&](const std::string& why) {
    return Error(Errc::io, "cannot map the shared segment " + std::to_string(ref.id) + " of process " +
                               std::to_string(ref.pid) + " (" + path + ", " + std::to_string(ref.size) +
                               " bytes): " + why);
  };
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw fail(std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw fail(std::strerror(errno));
  if (static_cast<std::uint64_t>(st.st_ino) != ref.inode || static_cast<std::uint64_t>(st.st_size) < ref.size) {
    throw fail("the descriptor names another file (inode " + std::to_string(st.st_ino) + ", " +
               std::to_string(st.st_size) + " bytes): the process freed the segment or is in another pid namespace");
  }
  // Populated at once: faulting the pages in one by one would cost more than the copy.
  void* base = ::mmap(nullptr, ref.size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (base == MAP_FAILED) throw fail(std::string("mmap: ") + std::strerror(errno));
  PeerMapping m;
  m.base_ = base;
  m.size_ = ref.size;
  return m;
}

}  // namespace coshard
