// A floor under thread stack sizes set with pthread_attr_setstacksize.
//
// Why: Debian's civetweb (under prometheus-cpp's Exposer) starts its HTTP workers with fixed
// 100 KiB stacks, and a thread's static TLS lives inside that allocation. A trainer process
// loads OpenBLAS (60 KiB of static TLS), NCCL (12 KiB) and the CUDA runtime (4 KiB), which leaves
// a worker about 20 KiB of stack: serialising /metrics then runs past the bottom, over the
// guard page (frames with 8 KiB buffers skip it), into the next worker's thread descriptor, and
// that worker crashes later (seen as SIGSEGV in __pthread_disable_asynccancel). This definition
// interposes on libc's (the executable exports it: see metrics/CMakeLists.txt) and raises any
// request below the floor; everything else goes to libc unchanged.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace coshard::metrics::detail {
constexpr std::size_t kStackFloor = 1u << 20;
// Referenced by the exporter so that a static link keeps this object.
int thread_stack_floor_linked() { return static_cast<int>(kStackFloor >> 20); }
}  // namespace coshard::metrics::detail

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, std::size_t size) {
  using Fn = int (*)(pthread_attr_t*, std::size_t);
  static const Fn next = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (!next) return 22;  // EINVAL: libc's own symbol cannot be missing in practice
  return next(attr, std::max(size, coshard::metrics::detail::kStackFloor));
}
