#pragma once
// The NCCL calls the NCCL communicator makes, behind an interface: the real library
// (real_nccl_api(), in CUDA builds) or a fake that runs on CPU streams (tests/transport/fake_nccl.hpp),
// so that the communicator's own logic (non-blocking polling, abort once, keep-alive, groups,
// the store's id keys, the watchdog) is tested on every machine, GPU or not.
//
// The calls mirror NCCL's (ncclResult_t, ncclComm_t, ncclRedOp_t become Status, Comm, RedOp);
// communicators are non-blocking: a call may return in_progress, and the caller polls
// async_error() of that communicator until it is no longer in progress before its next call.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "coshard/runtime/device.hpp"
#include "coshard/runtime/dtype.hpp"
#include "coshard/runtime/runtime.hpp"
#include "coshard/runtime/stream.hpp"
#include "coshard/transport/communicator.hpp"
#include "coshard/launch/store.hpp"

namespace coshard::transport::detail {

class NcclApi {
 public:
  enum class Status : std::uint8_t { success, in_progress, invalid_argument, invalid_usage, remote_error, other };
  using Comm = void*;                 // ncclComm_t
  using RedOp = int;                  // ncclRedOp_t
  using Id = std::array<char, 128>;   // ncclUniqueId
  enum class Red : std::uint8_t { sum, avg, max };

  virtual ~NcclApi() = default;

  /// What went wrong: the status and, where the library says more, its last error.
  virtual std::string describe(Status s) = 0;
  /// Makes `device` current for the calls that follow on this thread (cudaSetDevice).
  virtual void use_device(Device device) = 0;

  virtual Status unique_id(Id* id) = 0;
  /// Non-blocking ncclCommInitRankConfig: poll async_error(*comm) until not in progress.
  virtual Status init_rank(Comm* comm, int size, const Id& id, int rank) = 0;
  /// Non-blocking ncclCommSplit (color < 0: no color, *out stays null): poll async_error(*out).
  virtual Status split(Comm comm, int color, int key, Comm* out) = 0;
  virtual Status async_error(Comm comm, Status* state) = 0;
  virtual Status user_rank(Comm comm, int* rank) = 0;
  virtual Status count(Comm comm, int* size) = 0;
  virtual Status finalize(Comm comm) = 0;
  virtual Status destroy(Comm comm) = 0;  ///< frees `comm`
  virtual Status abort(Comm comm) = 0;    ///< frees `comm`: no call on it may follow, or run alongside

  virtual Status group_start() = 0;
  virtual Status group_end() = 0;

  /// ncclRedOpCreatePreMulSum with a host-immediate scalar of `dtype` (f32, bf16 or f16).
  virtual Status premul_sum(RedOp* op, double factor, DType dtype, Comm comm) = 0;
  virtual Status op_destroy(RedOp op, Comm comm) = 0;
  virtual RedOp builtin(Red red) = 0;

  // Collectives, enqueued on `stream` (the communicator's own).
  virtual Status all_gather(const void* in, void* out, std::size_t count, DType dtype, Comm comm, Stream& stream) = 0;
  virtual Status reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, RedOp op, Comm comm,
                                Stream& stream) = 0;
  virtual Status all_reduce(const void* in, void* out, std::size_t count, DType dtype, RedOp op, Comm comm,
                            Stream& stream) = 0;
  virtual Status broadcast(const void* in, void* out, std::size_t count, DType dtype, int root, Comm comm,
                           Stream& stream) = 0;
  virtual Status send(const void* in, std::size_t count, DType dtype, int peer, Comm comm, Stream& stream) = 0;
  virtual Status recv(void* out, std::size_t count, DType dtype, int peer, Comm comm, Stream& stream) = 0;
};

/// The NCCL library itself. Throws Error(bad_config) in a build without NCCL.
std::shared_ptr<NcclApi> real_nccl_api();

/// The unique id of communicator `name`'s new generation: rank 0 makes it and sets it in the store
/// under coshard/nccl/<name>/<generation>/id, the others wait for it there (up to `timeout`).
Task<NcclApi::Id> unique_id_of(NcclApi& api, launch::StoreClient* store, int rank, int size, std::string name,
                               std::chrono::milliseconds timeout);

/// The communicator over `api` (create_nccl_communicator() passes the real library; tests a fake).
Task<std::unique_ptr<Communicator>> create_nccl_communicator(std::shared_ptr<NcclApi> api, Runtime& runtime,
                                                             launch::StoreClient* store, int rank, int size,
                                                             CommOptions options);

}  // namespace coshard::transport::detail
