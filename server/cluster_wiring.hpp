// The wiring of a server's cluster node (ingress/cluster_node.hpp) to its gateway's PULL credit,
// its admission actor and its /metrics: kept here so that server.cpp only calls it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "actors/protocol.hpp"
#include "ingress/cluster_node.hpp"
#include "ingress/gateway.hpp"
#include "server/config.hpp"

namespace sy {

/// The cluster node of a server whose config names NATS servers (cluster.nats / --nats), else
/// nullptr. It fetches the router's priority classes in rank order (most important first) and
/// decodes job bodies under `limits` (the gateway's, with endpoints.max_message_bytes).
std::shared_ptr<cluster::ClusterNode> make_cluster_node(const ServerConfig& cfg,
                                                        wire::DecodeLimits limits);

/// Lets the node take the gateway's PULL credit and hand jobs and cancels to admission.
void wire_cluster_node(cluster::ClusterNode& node, std::weak_ptr<Gateway> gateway,
                       AdmissionActor admission);

/// The node's /metrics text, for MetricsEndpoint's `extra` (empty function without a node).
std::function<std::string()> cluster_metrics(std::weak_ptr<cluster::ClusterNode> node);

}  // namespace sy
