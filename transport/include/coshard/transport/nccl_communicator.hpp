#pragma once
// The NCCL backend: device memory, collectives enqueued on the communicator's own CUDA stream
// after the caller's stream (an event wait, not a host block). The unique id travels through the
// store; communicators are created non-blocking with a deadline; a watchdog thread polls
// ncclCommGetAsyncError and the deadline of the oldest operation, and aborts the communicator
// (ncclCommAbort) from that one place, so every later operation fails with the reason.
// Built when CUDA and NCCL are found (COSHARD_HAVE_CUDA); otherwise the factory says so.
#include <memory>

#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/communicator.hpp"
#include "coshard/launch/store.hpp"

namespace coshard::transport {

/// True when this build has the NCCL backend.
bool nccl_available() noexcept;

/// Collective over the `size` ranks that share `store` (null only when size == 1). `runtime` must be
/// on a CUDA device. Runs on the scheduler of the calling task.
Task<std::unique_ptr<Communicator>> create_nccl_communicator(Runtime& runtime, launch::StoreClient* store, int rank, int size,
                                                             CommOptions options);

}  // namespace coshard::transport
