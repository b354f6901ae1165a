// Backend choice for executors: CPU always; CUDA only in builds with SWITCHYARD_HAVE_CUDA and
// with a device present.
#include "gpu/backend.hpp"

#include <stdexcept>

#ifdef SWITCHYARD_HAVE_CUDA
#include "gpu/cuda_engine.hpp"
#include "model/llama.hpp"
#endif

namespace sy {

int usable_cuda_devices() {
#ifdef SWITCHYARD_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

namespace {
std::string name_of(Backend b) {
  const auto i = static_cast<unsigned>(b);
  return i < detail::backend_names.size() ? std::string(to_string(b)) : std::to_string(i);
}
}  // namespace

Backend resolve_backend(Backend requested, std::string* why) {
  auto say = [&](const std::string& s) {
    if (why) *why = s;
  };
  if (requested == Backend::cpu || requested == Backend::null) {
    say("backend " + name_of(requested) + " (as configured)");
    return requested;
  }
  if (requested != Backend::automatic && requested != Backend::cuda) {
    throw std::invalid_argument("unknown backend '" + name_of(requested) +
                                "' (auto, cpu, cuda or null)");
  }
#ifdef SWITCHYARD_HAVE_CUDA
  const int n = usable_cuda_devices();
  if (n > 0) {
    say("backend cuda (" + std::to_string(n) + " CUDA device" + (n > 1 ? "s" : "") + ")");
    return Backend::cuda;
  }
  if (requested == Backend::cuda) {
    throw std::runtime_error(
        "backend cuda: no usable CUDA device (no GPU, no driver, or a driver older than the "
        "CUDA runtime); use --backend cpu or auto");
  }
  say("backend cpu (auto: no usable CUDA device)");
#else
  if (requested == Backend::cuda) {
    throw std::runtime_error(
        "backend cuda: this build has no CUDA backend (configure with -DSWITCHYARD_CUDA=ON where "
        "nvcc is installed); use --backend cpu or auto");
  }
  say("backend cpu (auto: this build has no CUDA backend)");
#endif
  return Backend::cpu;
}

std::unique_ptr<Engine> make_engine(Backend backend, std::shared_ptr<LlamaModel> model,
                                    const EngineOptions& opts, int device, double kv_gpu_fraction) {
  if (backend == Backend::cpu) return make_cpu_engine(std::move(model), opts);
  if (backend == Backend::cuda) {
    // The CUDA engine keeps one block table for every layer (docs/kv_policies.md).
    if (opts.n_window_blocks > 0)
      throw std::invalid_argument(
          "make_engine: the cuda backend keeps one KV block table for all layers "
          "(EngineOptions::n_window_blocks must be 0)");
#ifdef SWITCHYARD_HAVE_CUDA
    CudaEngineOptions co;
    co.device = device;
    // F32 files keep f32 weights on the device (the CPU engine's and llama.cpp's numbers); files
    // stored at 16 bits or quantized run in bf16. A bf16 copy of an F32 model is a conversion
    // away (llama.cpp's convert scripts), so serving never silently rounds what it was given.
    const auto& layers = model->weights().layers;
    co.f32_weights = !layers.empty() && layers.front().wq.type == kernels::DType::F32;
    co.kv_type = opts.kv_type;  // batching.kv_dtype; the CUDA engine refuses q8_0 by name
    co.block_size = opts.block_size;
    co.n_blocks = opts.n_blocks;
    co.kv_memory_fraction = kv_gpu_fraction;
    if (opts.max_batch_tokens > 0) co.max_batch_tokens = opts.max_batch_tokens;
    return make_cuda_engine(std::move(model), co);
#else
    (void)device;
    (void)kv_gpu_fraction;
    throw std::runtime_error("make_engine: this build has no CUDA backend");
#endif
  }
  throw std::invalid_argument("make_engine: unknown backend '" + name_of(backend) +
                              "' (cpu or cuda)");
}

}  // namespace sy
