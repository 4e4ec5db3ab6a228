// The unique id of a new NCCL communicator, made by rank 0 and read by the others from the store.
#include <cstring>
#include <string>
#include <vector>

#include "nccl_api.hpp"

namespace coshard::transport::detail {

Task<NcclApi::Id> unique_id_of(NcclApi& api, launch::StoreClient* store, int rank, int size, std::string name,
                               std::chrono::milliseconds timeout) {
  NcclApi::Id id{};
  if (size == 1 || rank == 0) {
    if (const auto s = api.unique_id(&id); s != NcclApi::Status::success) {
      throw Error(Errc::device, "ncclGetUniqueId failed: " + api.describe(s));
    }
  }
  if (size == 1) co_return id;
  // Every rank creates the communicators of a name in the same order, so its own count of them is
  // the generation: a second communicator of the name never reads the first one's id. Named
  // arguments, not temporaries, around co_await (GCC 12 miscompiles those).
  std::string counter = "coshard/nccl/" + name + "/created-by/" + std::to_string(rank);
  const std::int64_t generation = co_await store->add(std::move(counter), 1);
  const std::string key = "coshard/nccl/" + name + "/" + std::to_string(generation) + "/id";
  if (rank == 0) {
    std::string value(id.data(), id.size());
    std::string k = key;
    co_await store->set(std::move(k), std::move(value));
    co_return id;
  }
  std::vector<std::string> keys{key};
  auto values = co_await store->wait(std::move(keys), timeout);
  if (values[0].size() != id.size()) throw Error(Errc::io, "store key '" + key + "' is not an NCCL unique id");
  std::memcpy(id.data(), values[0].data(), id.size());
  co_return id;
}

}  // namespace coshard::transport::detail
