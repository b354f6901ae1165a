// Configuration of the executors: backend, count, threads, CPU priority and the test-only fault
// flags.
#pragma once

#include <cstdint>
#include <string>

#include "core/thread_class.hpp"
#include "gpu/backend_kind.hpp"

namespace sy {

/// The executors (config `executors`).
struct ExecutorConfig {
  Backend backend = Backend::automatic;  // auto (cuda where a device answers, else cpu) | cpu |
                                         // cuda | null (fixed tokens, no model: overhead)
  int count = 1;                         // batcher+executor pairs
  int threads = 0;                       // per executor; 0 = cores / count
  // The executors' threads and the Batch API's (core/thread_class.hpp).
  CpuPriority cpu_priority = CpuPriority::normal;
  int test_fault_throw_after = 0;  // TEST ONLY: the first executor throws after N steps (0 off)
  int test_fault_hang_after = 0;   // TEST ONLY: the first executor stops answering after N steps
  int test_fault_batcher_throw_after = 0;  // TEST ONLY: the first batcher throws after N steps
  // TEST ONLY: a job whose first planned chunk feeds this token id gets NaN logits (every
  // executor), so that it fails alone; -1 off.
  int test_nan_logits_token = -1;
};

/// A backend name the configuration accepts (auto, cpu, cuda, null: parse_backend() reads it);
/// gpu/backend.hpp resolves auto and checks that cuda can run.
inline bool known_backend(const std::string& b) {
  return parse_backend(b).has_value();
}

}  // namespace sy
