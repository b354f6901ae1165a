// Time as an actor sees it: the actor clock (caf::actor_clock), in the microseconds of every
// *_us field. In production it is the steady clock, the base of now_us(); on the test scheduler
// it moves only when a test advances it.
#pragma once

#include <caf/actor_clock.hpp>
#include <caf/local_actor.hpp>
#include <chrono>
#include <cstdint>

namespace sy {

/// The actor clock of `self` in microseconds.
inline int64_t actor_clock_us(const caf::local_actor& self) {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             self.clock().now().time_since_epoch())
      .count();
}

}  // namespace sy
