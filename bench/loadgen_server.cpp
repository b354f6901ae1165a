// The servers bench_loadgen starts itself: a `switchyard serve` child, where its binary is, and
// the config file that sets its prefix cache.
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "bench/loadgen.hpp"

namespace sy::bench::loadgen {

Spawned::Spawned(const std::string& bin, const std::vector<std::string>& extra)
    : proc_(options(bin, extra)) {
  std::cerr << "bench_loadgen: " << proc_.ready_line() << "\n";
  if (proc_.endpoint().empty()) throw std::runtime_error("switchyard serve printed no endpoint");
}

std::string Spawned::stats() {
  // The server answers at once; a second is plenty even under load.
  return proc_.stats_line(std::chrono::milliseconds(2000)).value_or("");
}

// The grace period is for in-flight jobs; all of ours are finished, so 10 s is generous.
void Spawned::stop() {
  proc_.stop(SIGTERM, std::chrono::seconds(10));
}

sy::test::ServeOptions Spawned::options(const std::string& bin,
                                        const std::vector<std::string>& extra) {
  sy::test::ServeOptions o;
  o.binary = bin;
  o.args = {"--bind", "tcp://127.0.0.1:*"};
  o.args.insert(o.args.end(), extra.begin(), extra.end());
  // Loading a model may take a while on a busy 2-core machine.
  o.startup = std::chrono::seconds(180);
  o.death_signal = SIGTERM;
  return o;
}

std::string default_switchyard() {
  // bench_loadgen lives in BUILD/bench/, the server binary in BUILD/.
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "./switchyard";
  return (self.parent_path().parent_path() / "switchyard").string();
}

CacheConfig::CacheConfig(bool on) {
  char tmpl[] = "/tmp/bench_loadgen-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  path_ = (dir_ / "prefix_cache.yaml").string();
  std::ofstream f(path_);
  f << "batching: {prefix_cache: " << (on ? "true" : "false") << "}\n";
  if (!f) throw std::runtime_error("cannot write " + path_);
}

CacheConfig::~CacheConfig() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

}  // namespace sy::bench::loadgen
