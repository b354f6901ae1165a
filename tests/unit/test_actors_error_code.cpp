// The error enum that crosses actor boundaries: its values are the wire codes of
// docs/protocol.md, a caf::error made from it renders the wire name, and both it and the result
// enums of the actor messages survive CAF's binary serializer.
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "core/error_code.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/test_system.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_error_code)

using namespace sy;

namespace {

/// The codes of the "## Error codes" table in docs/protocol.md, in the table's order.
std::vector<std::string> documented_codes() {
  std::ifstream in(std::string(SY_SOURCE_DIR) + "/docs/protocol.md");
  BOOST_REQUIRE(in);
  std::vector<std::string> codes;
  std::string line;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) {
      if (in_section) break;
      in_section = line == "## Error codes";
      continue;
    }
    // A row: | `name` | meaning | retry? |
    if (in_section && line.rfind("| `", 0) == 0) {
      const auto end = line.find('`', 3);
      BOOST_REQUIRE(end != std::string::npos);
      codes.push_back(line.substr(3, end - 3));
    }
  }
  return codes;
}

template <class T>
T round_trip(caf::actor_system& sys, T x) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  auto err = sink(x);
  BOOST_REQUIRE(!err);
  T back;
  caf::binary_deserializer source{sys, buf};
  err = source(back);
  BOOST_REQUIRE(!err);
  return back;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_enum_is_the_documented_wire_codes_in_order) {
  const auto doc = documented_codes();
  BOOST_REQUIRE_EQUAL(doc.size(), detail::error_code_names.size());
  for (std::size_t i = 0; i < doc.size(); ++i) {
    BOOST_TEST_CONTEXT("row " << i << ": " << doc[i]) {
      const auto parsed = error_code_from_string(doc[i]);
      BOOST_REQUIRE(parsed.has_value());
      BOOST_TEST(static_cast<std::size_t>(*parsed) == i);
      BOOST_TEST(to_string(*parsed) == doc[i]);
    }
  }
  // Each enumerator by name: renaming one without the docs (or the docs without it) fails here.
  BOOST_TEST(to_string(ErrorCode::bad_request) == "bad_request");
  BOOST_TEST(to_string(ErrorCode::unauthorized) == "unauthorized");
  BOOST_TEST(to_string(ErrorCode::rate_limited) == "rate_limited");
  BOOST_TEST(to_string(ErrorCode::overloaded) == "overloaded");
  BOOST_TEST(to_string(ErrorCode::deadline_exceeded) == "deadline_exceeded");
  BOOST_TEST(to_string(ErrorCode::cancelled) == "cancelled");
  BOOST_TEST(to_string(ErrorCode::not_found) == "not_found");
  BOOST_TEST(to_string(ErrorCode::engine_dead) == "engine_dead");
  BOOST_TEST(to_string(ErrorCode::unavailable) == "unavailable");
  BOOST_TEST(to_string(ErrorCode::internal) == "internal");
  BOOST_TEST(!error_code_from_string("Overloaded").has_value());
}

BOOST_AUTO_TEST_CASE(a_caf_error_carries_the_code_and_renders_its_name) {
  test::TestSystem ts;
  for (std::size_t i = 0; i < detail::error_code_names.size(); ++i) {
    const auto code = static_cast<ErrorCode>(i);
    BOOST_TEST_CONTEXT(to_string(code)) {
      const caf::error plain = code;  // through make_error(ErrorCode), found by ADL
      // bad_request is the enum's 0, which CAF would read as "no error" unshifted.
      BOOST_TEST(static_cast<bool>(plain));
      BOOST_TEST(plain.category() == kErrorCategory);
      BOOST_TEST((error_code_of(plain) == code));
      BOOST_TEST((plain == code));
      BOOST_TEST(ts.sys->render(plain) == std::string(to_string(code)));

      const caf::error with_context = make_error(code, "No space left on device");
      BOOST_TEST((error_code_of(with_context) == code));
      BOOST_TEST(ts.sys->render(with_context) ==
                 std::string(to_string(code)) + " (No space left on device)");

      const caf::error back = round_trip(*ts.sys, with_context);
      BOOST_TEST((back == with_context));
      BOOST_TEST((error_code_of(back) == code));
      BOOST_TEST(ts.sys->render(back) == ts.sys->render(with_context));
    }
  }
  // Errors of other categories carry no ErrorCode.
  BOOST_TEST(!error_code_of(caf::make_error(caf::sec::request_timeout)).has_value());
  BOOST_TEST(!error_code_of(caf::error{}).has_value());
  BOOST_TEST((make_error(ErrorCode::overloaded) != ErrorCode::unavailable));
}

BOOST_AUTO_TEST_CASE(an_actor_error_reply_arrives_as_the_code) {
  test::TestSystem ts;
  auto refuser = ts.sys->spawn([]() -> caf::behavior {
    return {[](journal_atom) -> caf::result<uint8_t> {
      return make_error(ErrorCode::unavailable, "Input/output error");
    }};
  });
  std::optional<ErrorCode> got;
  std::string rendered;
  auto asker = ts.sys->spawn([&](caf::event_based_actor* self) -> caf::behavior {
    return {[&, self](tick_atom) {
      self->request(refuser, caf::infinite, journal_atom::value)
          .then([](uint8_t) { BOOST_FAIL("the refusal was answered as a success"); },
                [&, self](caf::error& err) {
                  got = error_code_of(err);
                  rendered = self->system().render(err);
                });
    }};
  });
  caf::anon_send(asker, tick_atom::value);
  ts.sched->run();
  BOOST_TEST((got == ErrorCode::unavailable));
  BOOST_TEST(rendered == "unavailable (Input/output error)");
  caf::anon_send_exit(asker, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(refuser, caf::exit_reason::user_shutdown);
  ts.sched->run();
}

BOOST_AUTO_TEST_CASE(the_message_enums_survive_the_binary_serializer) {
  test::TestSystem ts;
  JobOutcome o;
  o.uid = 7;
  o.outcome = Outcome::cancelled;
  o.code = ErrorCode::cancelled;
  o.done.finish = FinishReason::cancelled;
  o.error.code = ErrorCode::engine_dead;
  const JobOutcome o2 = round_trip(*ts.sys, o);
  BOOST_TEST(o2.uid == 7u);
  BOOST_TEST(o2.outcome == Outcome::cancelled);
  BOOST_TEST(o2.code == ErrorCode::cancelled);
  BOOST_TEST(o2.done.finish == FinishReason::cancelled);
  BOOST_TEST(o2.error.code == ErrorCode::engine_dead);

  StatusEvent s;
  s.state = JobState::failed;
  BOOST_TEST(round_trip(*ts.sys, s).state == JobState::failed);

  SeqResult r;
  r.code = ErrorCode::internal;
  BOOST_TEST(round_trip(*ts.sys, r).code == ErrorCode::internal);

  EnqueueReply q{EnqueueResult::full, 3, 250};
  const EnqueueReply q2 = round_trip(*ts.sys, q);
  BOOST_TEST(q2.result == EnqueueResult::full);
  BOOST_TEST(q2.position == 3u);
  BOOST_TEST(q2.retry_after_ms == 250);
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_error_code
