// Parses every manifest under deploy/kubernetes (no cluster runs here): each document has the
// keys Kubernetes requires, the objects refer to each other consistently (selectors and labels,
// ports, volumes, Services, the HPA's target), the nodes' ConfigMap loads with the server's own
// config loader, and the ports and paths it names are the ones the probes and args use. Then the
// monitoring files (deploy/prometheus, deploy/grafana, deploy/kustomization.yaml;
// docs/dashboards.md): they parse, have the structure Prometheus and Grafana's provisioning read,
// name only series docs/metrics.md documents and recording rules that exist, and are referenced
// where they are loaded from. tests/prometheus runs them against a real Prometheus.
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

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

namespace {

const fs::path kSource = fs::path(SY_SOURCE_DIR);
const fs::path kPrometheus = kSource / "deploy" / "prometheus";
const fs::path kGrafana = kSource / "deploy" / "grafana";
const std::vector<std::string> kRuleFiles = {"recording_rules.yml", "alert_rules.yml"};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  BOOST_TEST_REQUIRE(in.good(), p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// The series docs/metrics.md documents: the backticked names of its tables' first column. A
// `_x` after a name stands for that name with its last word replaced (`switchyard_kv_blocks_used`
// / `_free`); a histogram's series are NAME_bucket, NAME_sum and NAME_count.
std::set<std::string> documented_series() {
  std::set<std::string> out;
  std::istringstream in(read_text(kSource / "docs" / "metrics.md"));
  const std::regex tick("`([A-Za-z0-9_:]+)`");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `switchyard_", 0) != 0) continue;
    std::vector<std::string> cols;
    std::string col;
    std::istringstream row(line);
    while (std::getline(row, col, '|')) cols.push_back(trim(col));
    if (cols.size() < 3) continue;
    const std::string& names = cols[1];
    const bool histogram = cols[2] == "histogram";
    std::string last;
    for (std::sregex_iterator it(names.begin(), names.end(), tick), end; it != end; ++it) {
      std::string n = (*it)[1];
      if (n[0] == '_')
        n = last.substr(0, last.rfind('_')) + n;
      else
        last = n;
      out.insert(n);
      if (histogram)
        for (const char* suffix : {"_bucket", "_sum", "_count"}) out.insert(n + suffix);
    }
  }
  return out;
}

// The Switchyard names a PromQL expression reads: series (switchyard_...) and recording rules
// (switchyard:...).
std::set<std::string> names_in(const std::string& expr) {
  static const std::regex name(R"(\bswitchyard[_:][A-Za-z0-9_:]*)");
  std::set<std::string> out;
  for (std::sregex_iterator it(expr.begin(), expr.end(), name), end; it != end; ++it)
    out.insert(it->str());
  return out;
}

struct Rule {
  std::string file, group, name, expr;
  bool alert = false;
  YAML::Node node;
};

const std::vector<Rule>& rules() {
  static const std::vector<Rule> all = [] {
    std::vector<Rule> out;
    for (const auto& f : kRuleFiles) {
      const auto doc = YAML::LoadFile((kPrometheus / f).string());
      for (const auto& g : doc["groups"])
        for (const auto& r : g["rules"]) {
          Rule x{f,
                 str(g["name"]),
                 str(r["alert"]).empty() ? str(r["record"]) : str(r["alert"]),
                 str(r["expr"]),
                 !str(r["alert"]).empty(),
                 r};
          out.push_back(x);
        }
    }
    return out;
  }();
  return all;
}

const nlohmann::json& dashboard() {
  static const nlohmann::json d =
      nlohmann::json::parse(read_text(kGrafana / "dashboards" / "switchyard.json"));
  return d;
}

// The dashboard's template variables.
nlohmann::json variables() {
  return dashboard()
      .value("templating", nlohmann::json::object())
      .value("list", nlohmann::json::array());
}

// Every expression the dashboard sends: its panels' targets and its query variables.
std::vector<std::pair<std::string, std::string>> dashboard_exprs() {
  std::vector<std::pair<std::string, std::string>> out;
  const auto none = nlohmann::json::array();
  for (const auto& p : dashboard().value("panels", none))
    for (const auto& t : p.value("targets", none))
      out.emplace_back("panel '" + p.value("title", "") + "'", t.value("expr", ""));
  for (const auto& v : variables()) {
    if (v.value("type", "") != "query") continue;
    const auto q = v.value("query", nlohmann::json());
    out.emplace_back("variable " + v.value("name", ""), q.is_object()   ? q.value("query", "")
                                                        : q.is_string() ? q.get<std::string>()
                                                                        : "");
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(prometheus_rules_parse_and_follow_the_conventions) {
  const std::regex record_name("switchyard:[a-z0-9_]+:[a-z0-9_]+");
  const std::regex duration("[0-9]+[smh]");
  // n[a][b] as a string, "" when either is absent (yaml-cpp throws on a key of a missing node).
  auto at = [](const YAML::Node& n, const char* a, const char* b) {
    return n[a] ? str(n[a][b]) : std::string();
  };
  std::set<std::string> names, groups;
  size_t records = 0, alerts = 0;
  for (const auto& r : rules()) {
    const std::string what = r.file + ": " + r.name;
    BOOST_TEST(!r.group.empty(), r.file + ": a group without a name");
    BOOST_TEST(!r.name.empty(), r.file + ": a rule that is neither record nor alert");
    BOOST_TEST(!(r.node["record"] && r.node["alert"]), what + ": both record and alert");
    BOOST_TEST(!r.expr.empty(), what + ": no expr");
    BOOST_TEST(names.insert(r.name).second, what + ": named twice");
    groups.insert(r.group);
    if (r.alert) {
      ++alerts;
      BOOST_TEST(r.file == "alert_rules.yml", what);
      BOOST_TEST(r.name.rfind("Switchyard", 0) == 0u, what + ": not named Switchyard...");
      const std::string sev = at(r.node, "labels", "severity");
      BOOST_TEST((sev == "critical" || sev == "warning"), what + ": severity '" + sev + "'");
      BOOST_TEST(!at(r.node, "annotations", "summary").empty(), what + ": no summary");
      BOOST_TEST(!at(r.node, "annotations", "description").empty(), what + ": no description");
      if (r.node["for"]) BOOST_TEST(std::regex_match(str(r.node["for"]), duration), what + ": for");
    } else {
      ++records;
      BOOST_TEST(r.file == "recording_rules.yml", what);
      BOOST_TEST(std::regex_match(r.name, record_name),
                 what + ": not switchyard:metric:operations");
      BOOST_TEST(at(r.node, "labels", "severity").empty(),
                 what + ": a recording rule with a severity");
    }
  }
  BOOST_TEST(records > 0u);
  BOOST_TEST(alerts > 0u);
  // What the on-call person must hear (docs/dashboards.md lists each).
  for (const char* a :
       {"SwitchyardTTFTHigh", "SwitchyardJobErrors", "SwitchyardOverloaded",
        "SwitchyardJournalWriteErrors", "SwitchyardJournalFailing", "SwitchyardExecutorCrashLoop",
        "SwitchyardKVPressure", "SwitchyardClusterConsumerStalled"})
    BOOST_TEST(names.count(a) == 1u, a);
}

BOOST_AUTO_TEST_CASE(rules_and_dashboard_read_only_documented_series_and_existing_rules) {
  const auto documented = documented_series();
  // The tables' names, not a few stray ones: a sanity check of the parse above.
  BOOST_TEST_REQUIRE(documented.size() > 50u);
  BOOST_TEST(documented.count("switchyard_kv_blocks_free") == 1u);
  BOOST_TEST(documented.count("switchyard_generation_tokens_total") == 1u);
  BOOST_TEST(documented.count("switchyard_time_to_first_token_seconds_bucket") == 1u);
  std::set<std::string> recorded, read;
  for (const auto& r : rules())
    if (!r.alert) recorded.insert(r.name);
  auto check = [&](const std::string& what, const std::string& expr) {
    BOOST_TEST(!expr.empty(), what + ": an empty expression");
    for (const auto& n : names_in(expr)) {
      read.insert(n);
      if (n.find(':') != std::string::npos)
        BOOST_TEST(recorded.count(n) == 1u, what + " reads " + n + ", which no rule records");
      else
        BOOST_TEST(documented.count(n) == 1u,
                   what + " reads " + n + ", which docs/metrics.md does not list");
    }
  };
  for (const auto& r : rules()) check(r.file + ": " + r.name, r.expr);
  for (const auto& [what, expr] : dashboard_exprs()) check("the dashboard's " + what, expr);
  // Every recording rule is read by the dashboard, an alert or another rule.
  for (const auto& n : recorded) BOOST_TEST(read.count(n) == 1u, n + " is recorded but not read");
}

BOOST_AUTO_TEST_CASE(every_alert_has_a_promtool_case_that_fires_it) {
  // tests/prometheus/alert_rules_test.yml (run by CTest prometheus_rules) loads both rule files.
  const fs::path t = kSource / "tests" / "prometheus" / "alert_rules_test.yml";
  const auto doc = YAML::LoadFile(t.string());
  std::set<std::string> loaded;
  for (const auto& f : doc["rule_files"])
    loaded.insert(fs::weakly_canonical(t.parent_path() / f.as<std::string>()).string());
  for (const auto& f : kRuleFiles)
    BOOST_TEST(loaded.count(fs::weakly_canonical(kPrometheus / f).string()) == 1u, f);
  std::set<std::string> fired, quiet;
  for (const auto& c : doc["tests"])
    for (const auto& a : c["alert_rule_test"])
      (a["exp_alerts"].size() > 0 ? fired : quiet).insert(str(a["alertname"]));
  for (const auto& r : rules()) {
    if (!r.alert) continue;
    BOOST_TEST(fired.count(r.name) == 1u, r.name + ": no case where it fires");
    BOOST_TEST(quiet.count(r.name) == 1u, r.name + ": no case where it stays quiet");
  }
}

BOOST_AUTO_TEST_CASE(prometheus_config_loads_both_rule_files) {
  const auto cfg = YAML::LoadFile((kPrometheus / "prometheus.yml").string());
  std::set<std::string> files;
  for (const auto& f : cfg["rule_files"]) files.insert(f.as<std::string>());
  BOOST_TEST(files == std::set<std::string>(kRuleFiles.begin(), kRuleFiles.end()));
  BOOST_TEST_REQUIRE(cfg["scrape_configs"].size() > 0u);
  const auto job = cfg["scrape_configs"][0];
  BOOST_TEST(str(job["metrics_path"]) == "/metrics");
  BOOST_TEST(job["static_configs"][0]["targets"].size() > 0u);
}

BOOST_AUTO_TEST_CASE(dashboard_has_what_grafana_provisioning_reads) {
  const auto& d = dashboard();
  BOOST_TEST_REQUIRE(d.is_object());
  BOOST_TEST(!d.value("uid", "").empty());
  BOOST_TEST(!d.value("title", "").empty());
  BOOST_TEST_REQUIRE(d.contains("schemaVersion"));
  BOOST_TEST(d["schemaVersion"].is_number_integer());
  BOOST_TEST_REQUIRE((d.contains("panels") && d["panels"].is_array()));
  BOOST_TEST(d["panels"].size() > 0u);
  // The data source is a variable: any Prometheus, picked in Grafana.
  bool ds_var = false;
  std::set<std::string> vars;
  for (const auto& v : variables()) {
    vars.insert(v.value("name", ""));
    ds_var |= v.value("type", "") == "datasource" && v.value("name", "") == "datasource" &&
              v.value("query", "") == "prometheus";
  }
  BOOST_TEST(ds_var, "no `datasource` variable of type datasource, query prometheus");
  std::set<int> ids;
  std::set<std::pair<int, int>> cells;  // (x, y) of every grid cell a panel covers
  for (const auto& p : d["panels"]) {
    const std::string type = p.value("type", ""), title = p.value("title", "");
    const std::string what = "panel '" + title + "'";
    BOOST_TEST(!type.empty(), what + ": no type");
    BOOST_TEST(!title.empty(), "a panel without a title");
    BOOST_TEST(ids.insert(p.value("id", -1)).second, what + ": id missing or taken");
    const auto g = p.value("gridPos", nlohmann::json());
    BOOST_TEST_REQUIRE(g.is_object(), what + ": no gridPos");
    const int x = g.value("x", -1), y = g.value("y", -1), w = g.value("w", 0), h = g.value("h", 0);
    BOOST_TEST((x >= 0 && y >= 0 && w > 0 && h > 0 && x + w <= 24), what + ": gridPos");
    bool overlap = false;
    for (int i = x; i < x + w; ++i)
      for (int j = y; j < y + h; ++j) overlap |= !cells.insert({i, j}).second;
    BOOST_TEST(!overlap, what + ": overlaps another panel");
    if (type == "row") continue;
    BOOST_TEST(p.value("datasource", nlohmann::json::object()).value("uid", "") == "${datasource}",
               what + ": data source");
    const auto targets = p.value("targets", nlohmann::json::array());
    BOOST_TEST(targets.size() > 0u, what + ": no targets");
    std::set<std::string> refs;
    for (const auto& t : targets) {
      BOOST_TEST(!t.value("expr", "").empty(), what + ": a target without expr");
      BOOST_TEST(refs.insert(t.value("refId", "")).second, what + ": refId repeated");
    }
  }
  // Every $variable a query uses is defined (or one of Grafana's own).
  const std::regex var(R"(\$\{?([A-Za-z_][A-Za-z0-9_]*))");
  for (const auto& [what, expr] : dashboard_exprs())
    for (std::sregex_iterator it(expr.begin(), expr.end(), var), end; it != end; ++it) {
      const std::string n = (*it)[1];
      BOOST_TEST((vars.count(n) == 1u || n.rfind("__", 0) == 0), what + ": unknown $" + n);
    }
}

BOOST_AUTO_TEST_CASE(grafana_provisioning_files_point_at_the_dashboard_and_prometheus) {
  const auto dash =
      YAML::LoadFile((kGrafana / "provisioning" / "dashboards" / "switchyard.yaml").string());
  BOOST_TEST(dash["apiVersion"].as<int>() == 1);
  BOOST_TEST_REQUIRE(dash["providers"].size() > 0u);
  for (const auto& p : dash["providers"]) {
    BOOST_TEST(str(p["type"]) == "file");
    BOOST_TEST(!str(p["name"]).empty());
    BOOST_TEST(str(p["options"]["path"]).rfind("/", 0) == 0u, "options.path is not absolute");
  }
  const auto ds =
      YAML::LoadFile((kGrafana / "provisioning" / "datasources" / "prometheus.yaml").string());
  BOOST_TEST(ds["apiVersion"].as<int>() == 1);
  BOOST_TEST_REQUIRE(ds["datasources"].size() > 0u);
  for (const auto& s : ds["datasources"]) {
    BOOST_TEST(str(s["type"]) == "prometheus");
    BOOST_TEST(str(s["access"]) == "proxy");
    BOOST_TEST(str(s["url"]).rfind("http", 0) == 0u);
  }
}

BOOST_AUTO_TEST_CASE(kustomization_above_generates_the_monitoring_config_maps) {
  // deploy/kustomization.yaml: the nodes (deploy/kubernetes) plus a ConfigMap for each kind of
  // monitoring file. It sits above kubernetes/ because kustomize reads no file outside its folder.
  const fs::path root = kSource / "deploy";
  const auto k = YAML::LoadFile((root / "kustomization.yaml").string());
  BOOST_TEST(str(k["apiVersion"]) == "kustomize.config.k8s.io/v1beta1");
  BOOST_TEST(str(k["kind"]) == "Kustomization");
  std::set<std::string> resources;
  for (const auto& r : k["resources"]) resources.insert(r.as<std::string>());
  BOOST_TEST(resources == std::set<std::string>{"kubernetes"});
  // Stable names, so that a Prometheus or Grafana deployed apart can mount them.
  BOOST_TEST(k["generatorOptions"]["disableNameSuffixHash"].as<bool>());
  std::set<std::string> generated, names;
  bool dashboard_labelled = false;
  for (const auto& g : k["configMapGenerator"]) {
    const std::string name = str(g["name"]);
    BOOST_TEST(names.insert(name).second, name + " generated twice");
    for (const auto& d : docs())
      BOOST_TEST(!(d.kind() == "ConfigMap" && d.name() == name), name + " also in kubernetes/");
    for (const auto& f : g["files"]) {
      const std::string file = f.as<std::string>();
      BOOST_TEST(fs::is_regular_file(root / file), file);
      BOOST_TEST(fs::weakly_canonical(root / file)
                         .string()
                         .rfind(fs::weakly_canonical(root).string() + "/", 0) == 0u,
                 file + " is not below deploy/");
      generated.insert(file);
      if (fs::path(file).extension() == ".json")
        dashboard_labelled |= str(g["options"]["labels"]["grafana_dashboard"]) == "1";
    }
  }
  BOOST_TEST(dashboard_labelled, "the dashboard's ConfigMap lacks the grafana_dashboard label");
  // Every rule file, dashboard and provisioning file is in one.
  std::set<std::string> expected;
  for (const auto& f : kRuleFiles) expected.insert("prometheus/" + f);
  for (const char* dir : {"grafana/dashboards", "grafana/provisioning/dashboards",
                          "grafana/provisioning/datasources"})
    for (const auto& e : fs::directory_iterator(root / dir))
      expected.insert(fs::relative(e.path(), root).string());
  BOOST_TEST(generated == expected);
}

BOOST_AUTO_TEST_SUITE_END()  // test_deploy_manifests
