// GPU, process and trace-export series for /metrics (server/telemetry.hpp).
#include "server/telemetry.hpp"

#include <sys/resource.h>

#include <cstdio>
#include <functional>
#include <vector>

#include "actors/log.hpp"

namespace sy {

namespace {

std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string number(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

double process_cpu_seconds() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

Telemetry::Telemetry(bool gpu, bool fake_nvml, std::shared_ptr<TraceBuffer> traces)
    : traces_(std::move(traces)) {
  if (fake_nvml) {
    gpu_ = GpuTelemetry::fake();
    log::warn("TEST ONLY: --test-fake-nvml: the switchyard_gpu_* series are made up");
  } else if (gpu) {
    std::string why;
    gpu_ = GpuTelemetry::open_nvml(why);
    if (!gpu_) log::info("no GPU telemetry (no switchyard_gpu_* series): " + why);
  }
}

std::string Telemetry::text() {
  std::string out;
  family(out, "switchyard_process_cpu_seconds_total", "counter",
         "User and system CPU time of the server process, in seconds.");
  out += "switchyard_process_cpu_seconds_total " + number(process_cpu_seconds()) + "\n";
  if (traces_) {
    family(out, "switchyard_trace_spans_exported_total", "counter",
           "Spans the OTLP collector accepted.");
    out += "switchyard_trace_spans_exported_total " + std::to_string(traces_->exported()) + "\n";
    family(out, "switchyard_trace_spans_dropped_total", "counter",
           "Spans lost: the export queue was full, or their batch's export failed.");
    out += "switchyard_trace_spans_dropped_total " + std::to_string(traces_->dropped()) + "\n";
  }
  if (!gpu_) return out;
  const std::vector<GpuSample> gs = gpu_->sample();
  if (gs.empty()) return out;
  auto labels = [](const GpuSample& g) {
    return "{gpu=\"" + std::to_string(g.index) + "\",uuid=\"" + label_value(g.uuid) + "\"}";
  };
  family(out, "switchyard_gpu_info", "gauge", "1 per GPU, with its model name.");
  for (const auto& g : gs)
    out += "switchyard_gpu_info{gpu=\"" + std::to_string(g.index) + "\",uuid=\"" +
           label_value(g.uuid) + "\",name=\"" + label_value(g.name) + "\"} 1\n";
  struct Fam {
    const char* name;
    const char* type;
    const char* help;
    std::function<double(const GpuSample&)> value;  // < 0: the device has no such reading
  };
  const Fam fams[] = {
      {"switchyard_gpu_utilization_ratio", "gauge",
       "Share of the last sample period a kernel ran on the GPU (DCGM_FI_DEV_GPU_UTIL / 100).",
       [](const GpuSample& g) { return g.utilization; }},
      {"switchyard_gpu_memory_used_bytes", "gauge",
       "GPU memory in use, in bytes (DCGM_FI_DEV_FB_USED is MiB).",
       [](const GpuSample& g) { return static_cast<double>(g.memory_used); }},
      {"switchyard_gpu_memory_capacity_bytes", "gauge", "GPU memory in all, in bytes.",
       [](const GpuSample& g) { return static_cast<double>(g.memory_total); }},
      {"switchyard_gpu_power_watts", "gauge", "GPU power draw in watts (DCGM_FI_DEV_POWER_USAGE).",
       [](const GpuSample& g) { return g.power_watts; }},
      {"switchyard_gpu_energy_joules_total", "counter",
       "GPU energy since the driver loaded, in joules (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION is "
       "mJ).",
       [](const GpuSample& g) {
         return g.energy_millijoules < 0 ? -1.0
                                         : static_cast<double>(g.energy_millijoules) / 1000.0;
       }},
  };
  for (const Fam& f : fams) {
    std::string rows;
    for (const auto& g : gs)
      if (double v = f.value(g); v >= 0) rows += f.name + labels(g) + " " + number(v) + "\n";
    if (rows.empty()) continue;  // no device has it: no bare header
    family(out, f.name, f.type, f.help);
    out += rows;
  }
  return out;
}

}  // namespace sy
