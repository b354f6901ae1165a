// BlockPool: the free list of fixed-size KV blocks that sequences' block tables point into.
#include <stdexcept>
#include <string>

#include "gpu/engine.hpp"

namespace sy {

BlockPool::BlockPool(int32_t n_blocks) : n_total_(n_blocks) {
  if (n_blocks < 0) throw std::invalid_argument("BlockPool: negative block count");
  free_.reserve(static_cast<size_t>(n_blocks));
  // Pushed in reverse so that alloc() hands out 0, 1, 2, ... (easy to read in traces).
  for (int32_t i = n_blocks; i-- > 0;) free_.push_back(i);
  in_use_.assign(static_cast<size_t>(n_blocks), 0);
}

std::optional<int32_t> BlockPool::alloc() {
  if (free_.empty()) return std::nullopt;
  const int32_t id = free_.back();
  free_.pop_back();
  in_use_[static_cast<size_t>(id)] = 1;
  return id;
}

void BlockPool::free(int32_t id) {
  if (id < 0 || id >= n_total_) {
    throw std::logic_error("BlockPool::free: block " + std::to_string(id) + " out of range");
  }
  if (!in_use_[static_cast<size_t>(id)]) {
    throw std::logic_error("BlockPool::free: block " + std::to_string(id) + " is not in use");
  }
  in_use_[static_cast<size_t>(id)] = 0;
  free_.push_back(id);
}

}  // namespace sy
