// A CAF actor system on the deterministic test scheduler (caf::scheduler::test_coordinator):
// messages run only when a test calls sched->run(), time moves only when the test advances it.
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <memory>

#include "actors/messages.hpp"

namespace sy::test {

/// The system, its config and its scheduler; actor tests derive their rigs from it.
struct TestSystem {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;

  TestSystem() {
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.file-verbosity", caf::atom("quiet"));
    register_message_types(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
    // Like CAF's own fixture: time must not start at 0 (a zero time point means "unset").
    sched->clock().current_time += std::chrono::hours(1);
  }
};

}  // namespace sy::test
