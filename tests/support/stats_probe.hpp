// Reads an actor's stats record (actors/stats.hpp) on the deterministic test scheduler: a
// one-shot actor asks, the scheduler runs until it has the answer.
#pragma once

#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <memory>
#include <optional>

#include "actors/messages.hpp"
#include "tests/support/test_system.hpp"

namespace sy::test {

/// `who`'s answer to stats_atom as the record R (the test fails when none comes).
template <class R, class Handle>
R probe_stats(TestSystem& ts, const Handle& who) {
  auto out = std::make_shared<std::optional<R>>();
  ts.sys->spawn([out, who](caf::event_based_actor* self) {
    self->request(who, caf::infinite, stats_atom::value).then([out](R& r) { *out = std::move(r); });
  });
  ts.sched->run();
  BOOST_REQUIRE_MESSAGE(out->has_value(), "no stats answer");
  return **out;
}

}  // namespace sy::test
