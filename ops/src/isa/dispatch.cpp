#include <cstdlib>
#include <string>
#include <string_view>

#include "../check.hpp"
#include "coshard/ops/cpu.hpp"
#include "cpu_kernels.hpp"

namespace coshard::ops::detail {

namespace isa_baseline {
const CpuKernels& table();
}
#if defined(COSHARD_ISA_X86)
namespace isa_avx2 {
const CpuKernels& table();
}
namespace isa_avx512 {
const CpuKernels& table();
}
#endif

namespace {

// What the x86-64-v3 and -v4 builds may use (GCC and clang emit BMI, LZCNT and MOVBE in scalar
// code under those levels, and F16C, which clang 14 cannot query, only for half floats, which
// kernels.cpp has none of; every CPU with AVX2 and FMA has them all).
bool cpu_runs_avx2() {
#if defined(COSHARD_ISA_X86)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
         __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

bool cpu_runs_avx512() {
#if defined(COSHARD_ISA_X86)
  return cpu_runs_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

const CpuKernels& choose() {
  const CpuKernelList all = runnable_cpu_kernels();
  const char* want = std::getenv("COSHARD_CPU_ISA");
  if (want == nullptr || *want == '\0') return *all.tables[all.size - 1];
  std::string names;
  for (std::size_t i = 0; i < all.size; ++i) {
    if (std::string_view(want) == all.tables[i]->isa) return *all.tables[i];
    names += (i ? ", " : "") + std::string(all.tables[i]->isa);
  }
  fail("COSHARD_CPU_ISA", "'" + std::string(want) + "' is not an instruction set this build has and this CPU runs (" +
                              names + "); unset it to use the widest");
}

}  // namespace

CpuKernelList runnable_cpu_kernels() {
  CpuKernelList list{{&isa_baseline::table()}, 1};
#if defined(COSHARD_ISA_X86)
  if (cpu_runs_avx2()) list.tables[list.size++] = &isa_avx2::table();
  if (cpu_runs_avx512()) list.tables[list.size++] = &isa_avx512::table();
#endif
  return list;
}

const CpuKernels& cpu_kernels() {
  static const CpuKernels& chosen = choose();  // a bad COSHARD_CPU_ISA throws again on every call
  return chosen;
}

}  // namespace coshard::ops::detail

namespace coshard::ops {

const char* cpu_isa() { return detail::cpu_kernels().isa; }

}  // namespace coshard::ops
