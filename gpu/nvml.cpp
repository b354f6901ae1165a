// NVML loaded at run time, and the test stand-in (gpu/nvml.hpp). The few NVML entry points used
// are declared here with the C ABI of nvml.h (stable since NVML 5), so that no header or library
// of the driver is needed to build.
#include "gpu/nvml.hpp"

#include <dlfcn.h>

#include <chrono>
#include <mutex>

namespace sy {

namespace {

using nvmlReturn_t = int;  // NVML_SUCCESS = 0
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu, memory;  // percent of the last sample period
};
struct nvmlMemory_t {
  unsigned long long total, free, used;  // bytes
};

struct NvmlApi {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*count)(unsigned int*) = nullptr;
  nvmlReturn_t (*handle)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;         // mW
  nvmlReturn_t (*energy)(nvmlDevice_t, unsigned long long*) = nullptr;  // mJ
};

template <class F>
bool bind(void* lib, const char* symbol, F& f) {
  f = reinterpret_cast<F>(::dlsym(lib, symbol));
  return f != nullptr;
}

class Nvml : public GpuTelemetry {
 public:
  Nvml(void* lib, NvmlApi api, std::vector<nvmlDevice_t> devices)
      : lib_(lib), api_(api), devices_(std::move(devices)) {
    for (unsigned i = 0; i < devices_.size(); ++i) {
      GpuSample s;
      s.index = i;
      char buf[96] = {};
      if (api_.uuid(devices_[i], buf, sizeof buf) == 0) s.uuid = buf;
      char nbuf[96] = {};
      if (api_.name(devices_[i], nbuf, sizeof nbuf) == 0) s.name = nbuf;
      ids_.push_back(s);
    }
  }
  ~Nvml() override {
    api_.shutdown();
    ::dlclose(lib_);
  }
  std::vector<GpuSample> sample() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<GpuSample> out = ids_;
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      GpuSample& s = out[i];
      nvmlUtilization_t u{};
      if (api_.utilization(devices_[i], &u) == 0) s.utilization = u.gpu / 100.0;
      nvmlMemory_t m{};
      if (api_.memory(devices_[i], &m) == 0) {
        s.memory_used = static_cast<int64_t>(m.used);
        s.memory_total = static_cast<int64_t>(m.total);
      }
      unsigned int mw = 0;
      if (api_.power(devices_[i], &mw) == 0) s.power_watts = mw / 1000.0;
      unsigned long long mj = 0;
      // Volta and later; older devices answer NOT_SUPPORTED and the series is left out.
      if (api_.energy && api_.energy(devices_[i], &mj) == 0)
        s.energy_millijoules = static_cast<int64_t>(mj);
    }
    return out;
  }

 private:
  void* lib_;
  NvmlApi api_;
  std::vector<nvmlDevice_t> devices_;
  std::vector<GpuSample> ids_;
  std::mutex mu_;
};

class FakeNvml : public GpuTelemetry {
 public:
  std::vector<GpuSample> sample() override {
    using namespace std::chrono;
    const double s = duration<double>(steady_clock::now() - start_).count();
    GpuSample g;
    g.index = 0;
    g.uuid = "GPU-00000000-0000-0000-0000-000000000000";
    g.name = "fake-gpu-0";
    g.utilization = 0.5;
    g.memory_used = int64_t{1} << 30;
    g.memory_total = int64_t{80} << 30;
    g.power_watts = 300.0;
    g.energy_millijoules = 1000000 + static_cast<int64_t>(300.0 * 1000.0 * s);
    return {g};
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

std::unique_ptr<GpuTelemetry> GpuTelemetry::open_nvml(std::string& why) {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    why = "libnvidia-ml.so.1 is not installed (no NVIDIA driver)";
    return nullptr;
  }
  NvmlApi a;
  const bool ok =
      bind(lib, "nvmlInit_v2", a.init) && bind(lib, "nvmlShutdown", a.shutdown) &&
      bind(lib, "nvmlErrorString", a.error_string) && bind(lib, "nvmlDeviceGetCount_v2", a.count) &&
      bind(lib, "nvmlDeviceGetHandleByIndex_v2", a.handle) &&
      bind(lib, "nvmlDeviceGetName", a.name) && bind(lib, "nvmlDeviceGetUUID", a.uuid) &&
      bind(lib, "nvmlDeviceGetUtilizationRates", a.utilization) &&
      bind(lib, "nvmlDeviceGetMemoryInfo", a.memory) &&
      bind(lib, "nvmlDeviceGetPowerUsage", a.power);
  if (!ok) {
    why = "libnvidia-ml.so.1 lacks an NVML entry point (a driver older than NVML 5?)";
    ::dlclose(lib);
    return nullptr;
  }
  bind(lib, "nvmlDeviceGetTotalEnergyConsumption", a.energy);  // optional
  if (nvmlReturn_t rc = a.init(); rc != 0) {
    why = std::string("NVML did not initialize: ") + a.error_string(rc);
    ::dlclose(lib);
    return nullptr;
  }
  unsigned int n = 0;
  std::vector<nvmlDevice_t> devices;
  if (a.count(&n) == 0)
    for (unsigned i = 0; i < n; ++i) {
      nvmlDevice_t d = nullptr;
      if (a.handle(i, &d) == 0) devices.push_back(d);
    }
  if (devices.empty()) {
    why = "NVML finds no GPU";
    a.shutdown();
    ::dlclose(lib);
    return nullptr;
  }
  return std::make_unique<Nvml>(lib, a, std::move(devices));
}

std::unique_ptr<GpuTelemetry> GpuTelemetry::fake() {
  return std::make_unique<FakeNvml>();
}

}  // namespace sy
