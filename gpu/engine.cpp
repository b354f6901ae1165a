// Engine-side helpers shared by every backend (step output access).
#include "gpu/engine.hpp"

#include <stdexcept>

namespace sy {

const float* StepOutput::row(size_t seq, int32_t k) const {
  if (seq >= offset.size()) throw std::out_of_range("StepOutput::row: no such sequence");
  const int32_t n = count[seq];
  if (k < 0) k = n - 1;
  if (k < 0 || k >= n) throw std::out_of_range("StepOutput::row: no such row");
  return logits.data() +
         (static_cast<size_t>(offset[seq]) + static_cast<size_t>(k)) * static_cast<size_t>(n_vocab);
}

}  // namespace sy
