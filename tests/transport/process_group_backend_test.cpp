// ProcessGroup picks the backend by the runtime's device (NCCL for CUDA tensors, UCX for host
// ones), refuses pairs that cannot move the tensors, and says which it picked in the metrics.
#include <gtest/gtest.h>

#include <string>

#include "coshard/metrics/prometheus_telemetry.hpp"
#include "coshard/transport/process_group.hpp"

using namespace coshard;
using namespace coshard::transport;
using namespace coshard::launch;

namespace {

std::string message_of(Backend wanted, Device device) {
  try {
    resolve_backend(wanted, device);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_config);
    return e.what();
  }
  ADD_FAILURE() << to_string(wanted) << " on " << device.to_string() << " was accepted";
  return {};
}

TEST(ProcessGroupBackend, AutoIsUcxForHostTensorsAndNcclForCudaOnes) {
  EXPECT_EQ(resolve_backend(Backend::automatic, Device::cpu()), Backend::ucx);
  EXPECT_EQ(resolve_backend(Backend::ucx, Device::cpu()), Backend::ucx);
  if (nccl_available()) {
    EXPECT_EQ(resolve_backend(Backend::automatic, Device::cuda(0)), Backend::nccl);
  } else {
    EXPECT_NE(message_of(Backend::automatic, Device::cuda(0)).find("-DCOSHARD_CUDA=ON"), std::string::npos);
  }
}

TEST(ProcessGroupBackend, ABackendThatCannotMoveTheTensorsIsRefusedNamingTheOther) {
  EXPECT_NE(message_of(Backend::nccl, Device::cpu()).find("use the UCX backend"), std::string::npos);
  EXPECT_NE(message_of(Backend::ucx, Device::cuda(1)).find("use the NCCL backend"), std::string::npos);
}

TEST(ProcessGroupBackend, TheGroupSaysWhichInItsMetrics) {
  metrics::PrometheusTelemetry telemetry;
  Runtime rt({.telemetry = &telemetry});
  auto pg = rt.scheduler().sync_wait(ProcessGroup::create(rt, LaunchEnv{}, ProcessGroupOptions{}));
  EXPECT_EQ(pg->backend(), Backend::ucx);
  EXPECT_EQ(pg->world().backend(), "ucx");
  const std::string text = telemetry.serialize();
  EXPECT_NE(text.find("coshard_process_group_backend_info{device=\"cpu:0\""), std::string::npos) << text;
  EXPECT_NE(text.find("transport=\"ucx\""), std::string::npos) << text;
}

}  // namespace
