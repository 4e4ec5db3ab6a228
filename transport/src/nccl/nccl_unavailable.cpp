// Builds without CUDA/NCCL: the backend is absent and says how to get it.
#include "coshard/transport/nccl_communicator.hpp"

namespace coshard::transport {

bool nccl_available() noexcept { return false; }

Task<std::unique_ptr<Communicator>> create_nccl_communicator(Runtime&, StoreClient*, int, int, CommOptions options) {
  throw Error(Errc::bad_config, "communicator '" + options.name +
                                    "': this coshard was built without CUDA/NCCL (COSHARD_CUDA=OFF, or nvcc/NCCL not "
                                    "found); rebuild with COSHARD_CUDA=ON, or use the UCX backend for host memory");
  co_return nullptr;
}

}  // namespace coshard::transport
