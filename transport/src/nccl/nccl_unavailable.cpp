// Builds without CUDA/NCCL: the library is absent (create_nccl_communicator says how to get it);
// the communicator's logic is still built, for the tests that run it over a fake.
#include "coshard/transport/nccl_communicator.hpp"
#include "nccl_api.hpp"

namespace coshard::transport {

bool nccl_available() noexcept { return false; }

std::shared_ptr<detail::NcclApi> detail::real_nccl_api() {
  throw Error(Errc::bad_config, "this coshard was built without CUDA/NCCL: rebuild with COSHARD_CUDA=ON");
}

}  // namespace coshard::transport
