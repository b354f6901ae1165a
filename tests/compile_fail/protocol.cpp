// Compile-time checks of the typed actor protocol (actors/protocol.hpp). Built once per case by
// CTest (tests/CMakeLists.txt): SY_CASE_ok must compile, and every other case must fail with the
// compiler's message for the mistake it makes, so a protocol slip is caught before it runs.
#include "actors/protocol.hpp"

#include <caf/all.hpp>

namespace sy {

// The journal's forwarding, written out: every egress event and the journal's own messages.
// SY_CASE_journal_missing_forward leaves one egress event out, as a forward forgotten when a new
// event was added to egress.
JournalActor::behavior_type journal_like(JournalActor::pointer self, EgressActor egress) {
  return {
      [=](out_atom, AcceptedEvent& e) { self->send(egress, out_atom::value, std::move(e)); },
      [=](out_atom, TokensEvent& e) { self->send(egress, out_atom::value, std::move(e)); },
      [=](out_atom, DoneEvent& e) { self->send(egress, out_atom::value, std::move(e)); },
      [=](out_atom, ErrorEvent& e) { self->send(egress, out_atom::value, std::move(e)); },
      [=](out_atom, StatusEvent& e) { self->send(egress, out_atom::value, std::move(e)); },
#ifndef SY_CASE_journal_missing_forward
      [=](out_atom, ControlEvent& e) { self->send(egress, out_atom::value, std::move(e)); },
#endif
      [=](out_atom, StepEvent& e) { self->send(egress, out_atom::value, std::move(e)); },
      [=](out_atom, ToolCallEvent& e) { self->send(egress, out_atom::value, std::move(e)); },
      [=](pull_atom, uint32_t n) { self->send(egress, pull_atom::value, n); },
      [](journal_atom, const Job&) -> uint8_t { return 0; },
      [](journal_atom, const JobOutcome&) {},
      [](journal_atom, const ProgramStep&) {},
      [](tick_atom) {},
      [](tick_atom, uint8_t) {},
      [](stats_atom) { return JournalStats{}; },
  };
}

void senders(caf::actor_system& sys, RouterActor router, EgressActor egress) {
  caf::scoped_actor self{sys};
  // What admission sends the router, and the answer it expects.
  self->request(router, caf::infinite, enqueue_atom::value, Job{})
#ifdef SY_CASE_wrong_reply_type
      .receive([](uint8_t) {}, [](caf::error&) {});  // the old untyped answer
#else
      .receive([](EnqueueReply&) {}, [](caf::error&) {});
#endif
  caf::anon_send(egress, out_atom::value, DoneEvent{});
#ifdef SY_CASE_unhandled_message
  caf::anon_send(egress, out_atom::value, Job{});  // egress takes events, not jobs
#endif
}

}  // namespace sy

int main() {
  return 0;
}
