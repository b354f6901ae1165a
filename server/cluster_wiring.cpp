// The cluster node's wiring (cluster_wiring.hpp).
#include "server/cluster_wiring.hpp"

#include <algorithm>
#include <caf/all.hpp>

#include "actors/router.hpp"

namespace sy {

std::shared_ptr<cluster::ClusterNode> make_cluster_node(const ServerConfig& cfg,
                                                        wire::DecodeLimits limits) {
  if (cfg.cluster.nats.empty()) return nullptr;
  auto classes = effective_classes(cfg.router.classes);
  std::stable_sort(classes.begin(), classes.end(),
                   [](const auto& a, const auto& b) { return a.rank < b.rank; });
  cluster::NodeOptions o;
  o.cluster = cfg.cluster;
  for (const auto& pc : classes) o.classes.push_back(pc.name);
  limits.max_message_bytes = cfg.endpoints.max_message_bytes;
  o.limits = limits;
  return std::make_shared<cluster::ClusterNode>(std::move(o));
}

void wire_cluster_node(cluster::ClusterNode& node, std::weak_ptr<Gateway> gateway,
                       AdmissionActor admission) {
  cluster::NodeHooks h;
  h.take_credit = [gateway](uint32_t n) -> uint32_t {
    auto g = gateway.lock();
    return g ? g->take_pull_credit(n) : 0;
  };
  h.return_credit = [gateway](uint32_t n) {
    if (auto g = gateway.lock()) g->add_pull_credit(n);
  };
  h.submit = [admission](SubmitRequest r) {
    caf::anon_send(admission, submit_atom::value, std::move(r));
  };
  h.cancel = [admission](KeyRequest k) {
    caf::anon_send(admission, cancel_atom::value, std::move(k));
  };
  node.set_hooks(std::move(h));
}

std::function<std::string()> cluster_metrics(std::weak_ptr<cluster::ClusterNode> node) {
  if (node.expired()) return {};
  return [node] {
    auto n = node.lock();
    return n ? cluster::metrics_text(n->stats(), n->classes()) : std::string();
  };
}

}  // namespace sy
