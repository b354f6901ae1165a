// The depth of admission's mailbox as the gateway sees it: requests the gateway handed over and
// requests admission has taken out, counted on both sides. The gateway refuses new requests with
// `overloaded` while the difference is at its bound, so a client flood cannot queue without limit
// in front of admission (docs/protocol.md, Backpressure).
#pragma once

#include <atomic>
#include <cstdint>

namespace sy {

struct IntakeMeter {
  std::atomic<uint64_t> handed{0}, taken{0};              // requests
  std::atomic<uint64_t> handed_bytes{0}, taken_bytes{0};  // their wire size

  void take(uint32_t bytes) {
    taken.fetch_add(1, std::memory_order_relaxed);
    taken_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  uint64_t waiting() const {
    return handed.load(std::memory_order_relaxed) - taken.load(std::memory_order_relaxed);
  }
  uint64_t waiting_bytes() const {
    return handed_bytes.load(std::memory_order_relaxed) -
           taken_bytes.load(std::memory_order_relaxed);
  }
};

}  // namespace sy
