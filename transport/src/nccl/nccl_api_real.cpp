// NcclApi over the NCCL library (CUDA builds).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>

#include "coshard/kernels/cast.hpp"
#include "coshard/runtime/cuda.hpp"
#include "coshard/transport/nccl_communicator.hpp"
#include "nccl_api.hpp"

namespace coshard::transport {

bool nccl_available() noexcept { return true; }

namespace detail {
namespace {

using Status = NcclApi::Status;

Status status_of(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return Status::success;
    case ncclInProgress: return Status::in_progress;
    case ncclInvalidArgument: return Status::invalid_argument;
    case ncclInvalidUsage: return Status::invalid_usage;
    case ncclRemoteError: return Status::remote_error;
    default: return Status::other;
  }
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
  }
  return ncclFloat32;
}

ncclComm_t comm_of(NcclApi::Comm c) { return static_cast<ncclComm_t>(c); }
cudaStream_t stream_of(Stream& s) { return static_cast<cudaStream_t>(s.impl().native()); }

class RealNccl final : public NcclApi {
 public:
  std::string describe(Status s) override {
    const ncclResult_t r = s == Status::in_progress        ? ncclInProgress
                           : s == Status::invalid_argument ? ncclInvalidArgument
                           : s == Status::invalid_usage    ? ncclInvalidUsage
                           : s == Status::remote_error     ? ncclRemoteError
                           : s == Status::success          ? ncclSuccess
                                                           : ncclInternalError;
    const char* last = ncclGetLastError(nullptr);
    return std::string(ncclGetErrorString(r)) + (last && *last ? std::string(" (") + last + ")" : std::string());
  }
  void use_device(Device device) override {
    cuda::check_callable("ncclCommunicator (cudaSetDevice)");  // every NCCL path starts here
    if (const cudaError_t e = cudaSetDevice(device.index); e != cudaSuccess) {
      throw Error(Errc::device, "cudaSetDevice(" + std::to_string(device.index) + ") failed: " + cudaGetErrorString(e));
    }
  }
  Status unique_id(Id* id) override {
    ncclUniqueId u{};
    const Status s = status_of(ncclGetUniqueId(&u));
    static_assert(sizeof u.internal == sizeof(Id));
    std::memcpy(id->data(), u.internal, id->size());
    return s;
  }
  Status init_rank(Comm* comm, int size, const Id& id, int rank) override {
    ncclUniqueId u{};
    std::memcpy(u.internal, id.data(), id.size());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c = nullptr;
    const Status s = status_of(ncclCommInitRankConfig(&c, size, u, rank, &config));
    *comm = c;
    return s;
  }
  Status split(Comm comm, int color, int key, Comm* out) override {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c = nullptr;
    const Status s = status_of(ncclCommSplit(comm_of(comm), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &c, &config));
    *out = c;
    return s;
  }
  Status async_error(Comm comm, Status* state) override {
    ncclResult_t r = ncclSuccess;
    const Status s = status_of(ncclCommGetAsyncError(comm_of(comm), &r));
    *state = status_of(r);
    return s;
  }
  Status user_rank(Comm comm, int* rank) override { return status_of(ncclCommUserRank(comm_of(comm), rank)); }
  Status count(Comm comm, int* size) override { return status_of(ncclCommCount(comm_of(comm), size)); }
  Status finalize(Comm comm) override { return status_of(ncclCommFinalize(comm_of(comm))); }
  Status destroy(Comm comm) override { return status_of(ncclCommDestroy(comm_of(comm))); }
  Status abort(Comm comm) override { return status_of(ncclCommAbort(comm_of(comm))); }
  Status group_start() override { return status_of(ncclGroupStart()); }
  Status group_end() override { return status_of(ncclGroupEnd()); }
  Status premul_sum(RedOp* op, double factor, DType dtype, Comm comm) override {
    // A host scalar of the reduction's own type, read by NCCL during the call.
    float f = static_cast<float>(factor);
    std::uint16_t h = dtype == DType::bf16 ? kernels::f32_to_bf16(f) : kernels::f32_to_f16(f);
    void* scalar = dtype == DType::f32 ? static_cast<void*>(&f) : static_cast<void*>(&h);
    ncclRedOp_t made{};
    const Status s = status_of(ncclRedOpCreatePreMulSum(&made, scalar, nccl_type(dtype), ncclScalarHostImmediate,
                                                        comm_of(comm)));
    *op = static_cast<RedOp>(made);
    return s;
  }
  Status op_destroy(RedOp op, Comm comm) override {
    return status_of(ncclRedOpDestroy(static_cast<ncclRedOp_t>(op), comm_of(comm)));
  }
  RedOp builtin(Red red) override {
    return static_cast<RedOp>(red == Red::avg ? ncclAvg : red == Red::max ? ncclMax : ncclSum);
  }
  Status all_gather(const void* in, void* out, std::size_t count, DType dtype, Comm comm, Stream& stream) override {
    return status_of(ncclAllGather(in, out, count, nccl_type(dtype), comm_of(comm), stream_of(stream)));
  }
  Status reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, RedOp op, Comm comm,
                        Stream& stream) override {
    return status_of(ncclReduceScatter(in, out, count, nccl_type(dtype), static_cast<ncclRedOp_t>(op), comm_of(comm),
                                       stream_of(stream)));
  }
  Status all_reduce(const void* in, void* out, std::size_t count, DType dtype, RedOp op, Comm comm,
                    Stream& stream) override {
    return status_of(ncclAllReduce(in, out, count, nccl_type(dtype), static_cast<ncclRedOp_t>(op), comm_of(comm),
                                   stream_of(stream)));
  }
  Status broadcast(const void* in, void* out, std::size_t count, DType dtype, int root, Comm comm,
                   Stream& stream) override {
    return status_of(ncclBroadcast(in, out, count, nccl_type(dtype), root, comm_of(comm), stream_of(stream)));
  }
  Status send(const void* in, std::size_t count, DType dtype, int peer, Comm comm, Stream& stream) override {
    return status_of(ncclSend(in, count, nccl_type(dtype), peer, comm_of(comm), stream_of(stream)));
  }
  Status recv(void* out, std::size_t count, DType dtype, int peer, Comm comm, Stream& stream) override {
    return status_of(ncclRecv(out, count, nccl_type(dtype), peer, comm_of(comm), stream_of(stream)));
  }
};

}  // namespace

std::shared_ptr<NcclApi> real_nccl_api() { return std::make_shared<RealNccl>(); }

}  // namespace detail
}  // namespace coshard::transport
