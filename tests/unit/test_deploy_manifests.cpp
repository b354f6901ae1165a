// Parses every manifest under deploy/kubernetes (no cluster runs here): each document has the
// keys Kubernetes requires, the objects refer to each other consistently (selectors and labels,
// ports, volumes, Services, the HPA's target), the nodes' ConfigMap loads with the server's own
// config loader, and the ports and paths it names are the ones the probes and args use.
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "server/config.hpp"

BOOST_AUTO_TEST_SUITE(test_deploy_manifests)

namespace fs = std::filesystem;

namespace {

const fs::path kDeploy = fs::path(SY_SOURCE_DIR) / "deploy" / "kubernetes";

struct Doc {
  std::string file;  // relative to deploy/kubernetes
  YAML::Node node;
  std::string kind() const { return node["kind"].as<std::string>(); }
  std::string name() const { return node["metadata"]["name"].as<std::string>(); }
};

// Every document of every .yaml file (keda/ included), in file order.
const std::vector<Doc>& docs() {
  static const std::vector<Doc> all = [] {
    std::vector<Doc> out;
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(kDeploy))
      if (e.is_regular_file() && e.path().extension() == ".yaml") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files)
      for (const auto& n : YAML::LoadAllFromFile(f.string()))
        if (n && !n.IsNull()) out.push_back({fs::relative(f, kDeploy).string(), n});
    return out;
  }();
  return all;
}

std::vector<Doc> of_kind(const std::string& kind) {
  std::vector<Doc> out;
  for (const auto& d : docs())
    if (d.node["kind"] && d.kind() == kind) out.push_back(d);
  return out;
}

const Doc& the(const std::string& kind, const std::string& name) {
  for (const auto& d : docs())
    if (d.node["kind"] && d.kind() == kind && d.name() == name) return d;
  throw std::runtime_error("no " + kind + " named " + name + " in deploy/kubernetes");
}

std::string str(const YAML::Node& n) {
  return n && n.IsScalar() ? n.as<std::string>() : "";
}

// The port number a probe or Service names (a number, or a container port's name).
int resolve_port(const YAML::Node& containers, const YAML::Node& port) {
  const std::string p = str(port);
  if (!p.empty() && std::all_of(p.begin(), p.end(), ::isdigit)) return std::stoi(p);
  for (const auto& c : containers)
    for (const auto& cp : c["ports"])
      if (str(cp["name"]) == p) return cp["containerPort"].as<int>();
  return -1;
}

int port_of(const std::string& host_port) {
  return std::stoi(host_port.substr(host_port.rfind(':') + 1));
}

// The pod templates' shared checks: selector and labels, containers, probes, volumes.
void check_workload(const Doc& d) {
  const std::string what = d.file + ": " + d.kind() + " " + d.name();
  const auto spec = d.node["spec"];
  const auto match = spec["selector"]["matchLabels"];
  const auto labels = spec["template"]["metadata"]["labels"];
  BOOST_TEST_REQUIRE(match.IsMap(), what + ": spec.selector.matchLabels");
  BOOST_TEST(match.size() > 0u, what);
  for (const auto& kv : match)
    BOOST_TEST(str(labels[kv.first.as<std::string>()]) == kv.second.as<std::string>(),
               what + ": template label " + kv.first.as<std::string>());
  const auto pod = spec["template"]["spec"];
  const auto containers = pod["containers"];
  BOOST_TEST_REQUIRE(containers.IsSequence(), what + ": containers");
  BOOST_TEST(containers.size() > 0u, what);
  std::set<std::string> volumes;
  for (const auto& v : pod["volumes"]) volumes.insert(str(v["name"]));
  for (const auto& t : spec["volumeClaimTemplates"]) volumes.insert(str(t["metadata"]["name"]));
  for (const auto& c : containers) {
    const std::string cw = what + " container " + str(c["name"]);
    BOOST_TEST(!str(c["name"]).empty(), what + ": a container without a name");
    BOOST_TEST(!str(c["image"]).empty(), cw + ": no image");
    for (const char* probe : {"startupProbe", "livenessProbe", "readinessProbe"}) {
      if (!c[probe]) continue;
      BOOST_TEST(resolve_port(containers, c[probe]["httpGet"]["port"]) > 0,
                 cw + ": " + probe + " port names no container port");
    }
    for (const auto& m : c["volumeMounts"])
      BOOST_TEST(volumes.count(str(m["name"])) == 1u,
                 cw + ": mount of unknown volume " + str(m["name"]));
  }
  for (const auto& v : pod["volumes"]) {
    if (v["configMap"]) the("ConfigMap", str(v["configMap"]["name"]));
    if (v["persistentVolumeClaim"])
      the("PersistentVolumeClaim", str(v["persistentVolumeClaim"]["claimName"]));
  }
}

const YAML::Node container(const Doc& d, const std::string& name) {
  for (const auto& c : d.node["spec"]["template"]["spec"]["containers"])
    if (str(c["name"]) == name) return c;
  throw std::runtime_error(d.name() + " has no container " + name);
}

std::vector<std::string> words(const YAML::Node& c) {
  std::vector<std::string> w;
  for (const char* k : {"command", "args"})
    for (const auto& a : c[k]) w.push_back(a.as<std::string>());
  return w;
}

// The value after `flag` in a container's command line; "" when absent.
std::string flag_value(const YAML::Node& c, const std::string& flag) {
  auto w = words(c);
  for (size_t i = 0; i + 1 < w.size(); ++i)
    if (w[i] == flag) return w[i + 1];
  return "";
}

// The default priority classes (config absent): one consumer and one lag series each.
const std::vector<std::string> kClasses = {"interactive", "batch"};

}  // namespace

BOOST_AUTO_TEST_CASE(every_document_has_the_required_keys) {
  BOOST_TEST_REQUIRE(fs::is_directory(kDeploy), kDeploy.string());
  const std::map<std::string, std::string> api = {
      {"ConfigMap", "v1"},
      {"Service", "v1"},
      {"PersistentVolumeClaim", "v1"},
      {"Deployment", "apps/v1"},
      {"StatefulSet", "apps/v1"},
      {"HorizontalPodAutoscaler", "autoscaling/v2"},
      {"ScaledObject", "keda.sh/v1alpha1"},
      {"Kustomization", "kustomize.config.k8s.io/v1beta1"}};
  std::multiset<std::string> kinds;
  for (const auto& d : docs()) {
    BOOST_TEST_REQUIRE(d.node.IsMap(), d.file + ": a document that is not a mapping");
    const std::string kind = str(d.node["kind"]);
    BOOST_TEST(!kind.empty(), d.file + ": no kind");
    BOOST_TEST(!str(d.node["apiVersion"]).empty(), d.file + ": no apiVersion");
    BOOST_TEST(!str(d.node["metadata"]["name"]).empty(), d.file + ": " + kind + " without a name");
    auto it = api.find(kind);
    BOOST_TEST_REQUIRE((it != api.end()), d.file + ": unexpected kind " + kind);
    BOOST_TEST(str(d.node["apiVersion"]) == it->second, d.file + ": " + kind);
    kinds.insert(kind);
  }
  // What the deployment consists of: the nodes, NATS with JetStream, one autoscaler of each kind.
  BOOST_TEST(kinds.count("Deployment") == 1u);
  BOOST_TEST(kinds.count("StatefulSet") == 1u);
  BOOST_TEST(kinds.count("HorizontalPodAutoscaler") == 1u);
  BOOST_TEST(kinds.count("ScaledObject") == 1u);
  BOOST_TEST(kinds.count("Service") == 3u);
  // No two objects of a kind share a name (one would replace the other on apply).
  std::set<std::string> seen;
  for (const auto& d : docs())
    BOOST_TEST(seen.insert(d.kind() + "/" + d.name()).second, d.kind() + "/" + d.name());
}

BOOST_AUTO_TEST_CASE(workloads_select_their_pods_and_name_what_they_use) {
  for (const char* kind : {"Deployment", "StatefulSet"})
    for (const auto& d : of_kind(kind)) check_workload(d);
  // Services select the pods of a workload and name ports those pods have.
  for (const auto& s : of_kind("Service")) {
    const auto sel = s.node["spec"]["selector"];
    BOOST_TEST_REQUIRE(sel.IsMap(), s.name() + ": no selector");
    bool found = false;
    for (const char* kind : {"Deployment", "StatefulSet"})
      for (const auto& d : of_kind(kind)) {
        const auto labels = d.node["spec"]["template"]["metadata"]["labels"];
        bool all = true;
        for (const auto& kv : sel) all &= str(labels[kv.first.as<std::string>()]) == str(kv.second);
        if (!all) continue;
        found = true;
        const auto containers = d.node["spec"]["template"]["spec"]["containers"];
        for (const auto& p : s.node["spec"]["ports"])
          BOOST_TEST(resolve_port(containers, p["targetPort"]) > 0,
                     s.name() + ": targetPort " + str(p["targetPort"]));
      }
    BOOST_TEST(found, "Service " + s.name() + " selects no pods");
  }
}

BOOST_AUTO_TEST_CASE(nats_runs_jetstream_on_a_volume) {
  const auto& nats = the("StatefulSet", "nats");
  const auto c = container(nats, "nats");
  const auto w = words(c);
  BOOST_TEST(w.at(0) == "nats-server");
  BOOST_TEST(
      (std::count(w.begin(), w.end(), "-js") + std::count(w.begin(), w.end(), "--jetstream")) == 1);
  // The store is on the claim template's volume.
  const std::string store = flag_value(c, "-sd");
  BOOST_TEST_REQUIRE(!store.empty());
  const auto claim = nats.node["spec"]["volumeClaimTemplates"][0];
  BOOST_TEST(str(claim["spec"]["accessModes"][0]) == "ReadWriteOnce");
  bool on_claim = false;
  for (const auto& m : c["volumeMounts"])
    on_claim |= str(m["name"]) == str(claim["metadata"]["name"]) &&
                store.rfind(str(m["mountPath"]), 0) == 0;
  BOOST_TEST(on_claim, "the JetStream store " + store + " is not on the claim");
  // Its governing Service is headless; the client Service has the client port.
  const auto& headless = the("Service", str(nats.node["spec"]["serviceName"]));
  BOOST_TEST(str(headless.node["spec"]["clusterIP"]) == "None");
  const auto& svc = the("Service", "nats");
  bool client = false;
  for (const auto& p : svc.node["spec"]["ports"]) client |= p["port"].as<int>() == 4222;
  BOOST_TEST(client);
}

BOOST_AUTO_TEST_CASE(nodes_join_nats_and_probe_the_servers_own_endpoints) {
  const auto& dep = the("Deployment", "switchyard");
  const auto c = container(dep, "switchyard");
  const auto w = words(c);
  BOOST_TEST_REQUIRE(w.size() >= 2u);
  BOOST_TEST(w[1] == "serve");
  // --nats names the NATS Service's client port.
  BOOST_TEST(flag_value(c, "--nats") == "nats://nats:4222");
  // The probes ask the paths server/http serves, on the config's metrics port.
  BOOST_TEST(str(c["readinessProbe"]["httpGet"]["path"]) == "/ready");
  BOOST_TEST(str(c["livenessProbe"]["httpGet"]["path"]) == "/health");

  // The ConfigMap's file, where --config reads it, loads with the server's own loader (unknown
  // keys and bad values are refused there).
  const std::string config_path = flag_value(c, "--config");
  std::string mount, cm_name;
  for (const auto& m : c["volumeMounts"])
    if (config_path.rfind(str(m["mountPath"]) + "/", 0) == 0) mount = str(m["name"]);
  for (const auto& v : dep.node["spec"]["template"]["spec"]["volumes"])
    if (str(v["name"]) == mount) cm_name = str(v["configMap"]["name"]);
  BOOST_TEST_REQUIRE(!cm_name.empty(), "--config " + config_path + " is not on a ConfigMap");
  const auto& cm = the("ConfigMap", cm_name);
  const std::string key = fs::path(config_path).filename().string();
  const std::string text = str(cm.node["data"][key]);
  BOOST_TEST_REQUIRE(!text.empty(), "ConfigMap " + cm_name + " has no " + key);
  const fs::path tmp =
      fs::temp_directory_path() / ("sy_deploy_" + std::to_string(getpid()) + ".yaml");
  { std::ofstream(tmp) << text; }
  sy::ServerConfig cfg;
  try {
    sy::load_config_file(tmp.string(), cfg);
    sy::finalize_config(cfg);
  } catch (const std::exception& e) {
    fs::remove(tmp);
    BOOST_FAIL(std::string("the ConfigMap's config does not load: ") + e.what());
  }
  fs::remove(tmp);
  const auto containers = dep.node["spec"]["template"]["spec"]["containers"];
  BOOST_TEST(port_of(cfg.metrics.bind) ==
             resolve_port(containers, c["readinessProbe"]["httpGet"]["port"]));
  BOOST_TEST(port_of(cfg.endpoints.bind) == resolve_port(containers, YAML::Node("zmq")));
  // The model and the state folder are on mounted volumes (the root file system is read-only).
  auto mounted = [&](const std::string& path) {
    for (const auto& m : c["volumeMounts"])
      if (path.rfind(str(m["mountPath"]) + "/", 0) == 0 || path == str(m["mountPath"])) return true;
    return false;
  };
  BOOST_TEST(mounted(cfg.model), cfg.model);
  BOOST_TEST(mounted(cfg.state_dir), cfg.state_dir);
  BOOST_TEST(c["securityContext"]["readOnlyRootFilesystem"].as<bool>());
  // The node drains within the pod's grace period.
  BOOST_TEST(
      cfg.shutdown_grace_ms <
      1000 * dep.node["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as<int64_t>());
}

BOOST_AUTO_TEST_CASE(autoscalers_scale_the_nodes_2_to_10_on_consumer_lag) {
  const auto& hpa = the("HorizontalPodAutoscaler", "switchyard");
  const auto spec = hpa.node["spec"];
  BOOST_TEST(spec["minReplicas"].as<int>() == 2);
  BOOST_TEST(spec["maxReplicas"].as<int>() == 10);
  BOOST_TEST(str(spec["scaleTargetRef"]["kind"]) == "Deployment");
  BOOST_TEST(str(spec["scaleTargetRef"]["apiVersion"]) == "apps/v1");
  the("Deployment", str(spec["scaleTargetRef"]["name"]));
  // One External metric per default class on the lag gauge every node exports.
  std::set<std::string> classes;
  for (const auto& m : spec["metrics"]) {
    BOOST_TEST(str(m["type"]) == "External");
    BOOST_TEST(str(m["external"]["metric"]["name"]) == "switchyard_cluster_consumer_pending");
    BOOST_TEST(str(m["external"]["target"]["type"]) == "AverageValue");
    BOOST_TEST(std::stoi(str(m["external"]["target"]["averageValue"])) > 0);
    classes.insert(str(m["external"]["metric"]["selector"]["matchLabels"]["class"]));
  }
  BOOST_TEST(classes == std::set<std::string>(kClasses.begin(), kClasses.end()));

  const auto& keda = the("ScaledObject", "switchyard");
  const auto ks = keda.node["spec"];
  BOOST_TEST(ks["minReplicaCount"].as<int>() == 2);
  BOOST_TEST(ks["maxReplicaCount"].as<int>() == 10);
  BOOST_TEST(str(ks["scaleTargetRef"]["name"]) == str(spec["scaleTargetRef"]["name"]));
  std::set<std::string> consumers;
  for (const auto& t : ks["triggers"]) {
    BOOST_TEST(str(t["type"]) == "nats-jetstream");
    BOOST_TEST(str(t["metadata"]["stream"]) == "SWITCHYARD_JOBS");
    BOOST_TEST(port_of(str(t["metadata"]["natsServerMonitoringEndpoint"])) == 8222);
    consumers.insert(str(t["metadata"]["consumer"]));
  }
  // The nodes' durable consumers are named switchyard-<class>.
  BOOST_TEST(consumers == (std::set<std::string>{"switchyard-interactive", "switchyard-batch"}));
}

BOOST_AUTO_TEST_CASE(kustomization_lists_every_top_level_manifest) {
  const auto& k = the("Kustomization", "switchyard");
  std::set<std::string> listed, files;
  for (const auto& r : k.node["resources"]) listed.insert(r.as<std::string>());
  for (const auto& e : fs::directory_iterator(kDeploy))
    if (e.path().extension() == ".yaml" && e.path().filename() != "kustomization.yaml")
      files.insert(e.path().filename().string());
  // keda/ is the alternative to hpa.yaml: not listed.
  BOOST_TEST(listed == files);
}

BOOST_AUTO_TEST_SUITE_END()  // test_deploy_manifests
