// The trained test model (stories260K, loaded once per test process) and greedy token choice:
// shared by the engine tests on CPU and GPU. Header-only so each test keeps its own link set.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/llama.hpp"

namespace sy::test {

/// stories260K from SY_MODELS_DIR, loaded on first use.
inline std::shared_ptr<LlamaModel> stories_model() {
  static std::shared_ptr<LlamaModel> m =
      LlamaModel::load(std::string(SY_MODELS_DIR) + "/stories260K.gguf");
  return m;
}

/// Greedy choice: the highest logit, ties to the lowest id.
inline int32_t argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace sy::test
