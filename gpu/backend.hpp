// Choosing an executor's engine backend: the CPU engine, or the CUDA engine where this build
// has it and a device answers ("auto" picks). No CUDA header here, whatever the build.
#pragma once

#include <memory>
#include <string>

#include "gpu/backend_kind.hpp"
#include "gpu/engine.hpp"

namespace sy {

/// Usable CUDA devices for this build: 0 when it was built without the CUDA backend, or when the
/// runtime finds no device (no driver, no GPU, a driver older than the runtime).
int usable_cuda_devices();

/// The backend that `requested` (auto, cpu, cuda or null) means on this machine: auto becomes
/// cuda with a usable device, else cpu; the others stay. `why` (optional) gets one line on what
/// was found, for the server's start-up log. Throws std::invalid_argument for a value out of the
/// enum's range and std::runtime_error for cuda where it cannot run, saying why.
Backend resolve_backend(Backend requested, std::string* why = nullptr);

/// An engine of a resolved backend (cpu or cuda) for `model`. The CPU engine takes all of
/// `opts`; the CUDA engine runs on `device` with opts' block size, KV blocks (0: kv_gpu_fraction
/// of the device memory left after weights and step buffers) and step token budget, in f32 for
/// an F32 file and bf16 otherwise; it keeps one block table for all layers, so "cuda" with
/// opts.n_window_blocks > 0 throws std::invalid_argument, as does any other backend.
std::unique_ptr<Engine> make_engine(Backend backend, std::shared_ptr<LlamaModel> model,
                                    const EngineOptions& opts, int device = 0,
                                    double kv_gpu_fraction = 0.85);

}  // namespace sy
