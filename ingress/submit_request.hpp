// A decoded wire `submit` as the SubmitRequest admission takes: the one conversion that the
// ZeroMQ gateway and the cluster node (NATS) both use, so a job means the same on either edge.
#pragma once

#include "actors/messages.hpp"
#include "core/wire.hpp"

namespace sy {

/// The SubmitRequest for `s` from `client`, received now (arrival_us = now_us()). `stream`
/// holds only for clients that can take chunks: a DEALER client, or a cluster job (the node
/// clears it when the job has no reply subject); the pipeline results socket carries only
/// done/error.
SubmitRequest to_request(wire::Submit&& s, ClientRef client);

}  // namespace sy
