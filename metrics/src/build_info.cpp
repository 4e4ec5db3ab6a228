#include "coshard/metrics/build_info.hpp"

#include <ucp/api/ucp.h>

#include "coshard/launch/rendezvous.hpp"

#ifdef COSHARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef COSHARD_METRICS_HAVE_NCCL
#include <nccl.h>
#endif

namespace coshard::metrics {
namespace {

std::string cuda_version() {
#ifdef COSHARD_HAVE_CUDA
  int v = 0;  // the runtime library's own version: needs no driver and no device
  if (cudaRuntimeGetVersion(&v) != cudaSuccess || v <= 0) return "unknown";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
#else
  return "none";
#endif
}

std::string nccl_version() {
#ifdef COSHARD_METRICS_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess || v <= 0) return "unknown";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch; older releases major*1000 + minor*100 + patch.
  const int major = v >= 10000 ? v / 10000 : v / 1000;
  const int minor = v >= 10000 ? (v % 10000) / 100 : (v % 1000) / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
#else
  return "none";
#endif
}

std::string ucx_version() {
  const char* s = ucp_get_version_string();
  return s && *s ? std::string(s) : std::string("n/a");
}

}  // namespace

BuildInfo build_info() {
  return BuildInfo{.version = COSHARD_VERSION_STRING, .cuda = cuda_version(), .nccl = nccl_version(),
                   .ucx = ucx_version(), .wire_protocol = std::to_string(launch::kWireProtocol)};
}

}  // namespace coshard::metrics
