// CUDA emulator: what the cuBLASLt emulation needs from the runtime emulation.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>

#include "cuda_runtime.h"

namespace sy_emu {
/// The lock every emulated API call holds.
std::recursive_mutex& lock_api();
/// Queues (or, while the stream captures, records) host work that runs as device work.
void submit_fn(cudaStream_t s, std::function<void()> fn);
/// [p, p + bytes) inside one device allocation?
bool is_device_range(const void* p, size_t bytes);
}  // namespace sy_emu
