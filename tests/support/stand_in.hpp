// A test's stand-in for an actor (a scoped_actor, or an untyped actor that records what it gets)
// given to the actor under test as the typed handle it expects: the stand-in then receives what
// that actor sends there. Only tests cast this way; the server's own wiring is typed throughout.
#pragma once

#include <caf/all.hpp>

#include "actors/protocol.hpp"

namespace sy::test {

template <class Handle, class T>
Handle stand_in(const T& actor) {
  return caf::actor_cast<Handle>(actor);
}

/// The actor whose stats record is R.
template <class R>
struct HandleOf;
template <>
struct HandleOf<AdmissionStats> {
  using type = AdmissionActor;
};
template <>
struct HandleOf<RouterStats> {
  using type = RouterActor;
};
template <>
struct HandleOf<BatcherStats> {
  using type = BatcherActor;
};
template <>
struct HandleOf<ExecutorStats> {
  using type = ExecutorActor;
};
template <>
struct HandleOf<SupervisorStats> {
  using type = SupervisorActor;
};
template <>
struct HandleOf<JournalStats> {
  using type = JournalActor;
};

/// A stand-in that answers stats_atom with `record` (and nothing else), as the handle of the
/// actor whose record that is.
template <class R>
typename HandleOf<R>::type stats_double(caf::actor_system& sys, R record) {
  auto a = sys.spawn([record](caf::event_based_actor*) -> caf::behavior {
    return {[record](stats_atom) { return record; }};
  });
  return stand_in<typename HandleOf<R>::type>(a);
}

/// Sends user_shutdown to each valid handle, typed or not.
template <class... Handles>
void stop_all(const Handles&... hs) {
  auto stop = [](const auto& h) {
    if (h) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
  };
  (stop(hs), ...);
}

}  // namespace sy::test
