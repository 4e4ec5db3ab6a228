#pragma once
// Connection set-up of a UCX communicator: the exchange of worker addresses through the store,
// the endpoints, and the direct-path agreement (direct_probe.hpp).
#include <memory>
#include <string>

#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/communicator.hpp"
#include "coshard/launch/store.hpp"
#include "coshard/transport/ucx_communicator.hpp"
#include "direct_probe.hpp"
#include "hierarchy.hpp"
#include "wire.hpp"

namespace coshard::transport::detail {

// Publishes this rank's worker address under `prefix`, reads every rank's and connects; across
// hosts also the wires of the two-level schedules (hierarchy.hpp).
Task<std::unique_ptr<Communicator>> connect(Runtime& rt, launch::StoreClient* store, std::shared_ptr<UcxContext> ctx, int rank,
                                            int size, std::string prefix, CommOptions options, UcxOptions ucx);

// The communicator over a connected wire. In ucx_communicator.cpp, next to the class: connect
// ends by building one, and its split connects again.
std::unique_ptr<Communicator> make_ucx_communicator(Runtime& rt, launch::StoreClient* store, std::shared_ptr<UcxContext> ctx,
                                                    std::unique_ptr<Wire> wire, std::string key_prefix,
                                                    CommOptions options, UcxOptions ucx, DirectSetup direct,
                                                    Levels levels);

}  // namespace coshard::transport::detail
