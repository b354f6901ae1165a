// Admission actor tests on CAF's deterministic test_coordinator, with the real router behind it:
// authentication, quotas, prompt checks, job-key deduplication, status and cancellation.
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <memory>

#include "actors/admission.hpp"
#include "actors/messages.hpp"
#include "actors/router.hpp"
#include "core/error_code.hpp"
#include "model/llama.hpp"
#include "tests/support/stats_probe.hpp"
#include "tests/support/enum_print.hpp"
#include "tests/support/stand_in.hpp"
#include "tests/support/test_system.hpp"

BOOST_AUTO_TEST_SUITE(test_actors_admission)

using namespace sy;

namespace {

/// Everything the egress and the batcher saw, in order.
struct Trace {
  std::vector<Job> runs;
  std::vector<uint64_t> batcher_cancels;
  std::vector<AcceptedEvent> accepted;
  std::vector<ErrorEvent> errors;
  std::vector<DoneEvent> dones;
  std::vector<StatusEvent> statuses;
  uint64_t pull_credit = 0;
};
using TraceP = std::shared_ptr<Trace>;

caf::behavior egress_sink(caf::event_based_actor*, TraceP t) {
  return {
      [t](out_atom, const AcceptedEvent& e) { t->accepted.push_back(e); },
      [t](out_atom, const ErrorEvent& e) { t->errors.push_back(e); },
      [t](out_atom, const DoneEvent& e) { t->dones.push_back(e); },
      [t](out_atom, const StatusEvent& e) { t->statuses.push_back(e); },
      [](out_atom, const TokensEvent&) {},
      [t](pull_atom, uint32_t n) { t->pull_credit += n; },
  };
}

/// A batcher double: grants credit when the test asks and records the jobs it is given.
caf::behavior fake_batcher(caf::event_based_actor* self, TraceP t) {
  return {
      [=](credit_atom, const RouterActor& router, uint32_t n) {
        self->send(router, credit_atom::value, caf::actor_cast<BatcherActor>(self), n);
      },
      [=](run_atom, const Job& j) { t->runs.push_back(j); },
      [=](cancel_atom, uint64_t uid) { t->batcher_cancels.push_back(uid); },
      // A status request: every running job has generated 3 tokens so far.
      [=](status_atom, uint64_t) { return uint32_t{3}; },
  };
}

TenantConfig tenant(const std::string& name, const std::string& token, uint32_t max_in_flight = 0,
                    double rate = 0, double burst = 0) {
  TenantConfig t;
  t.name = name;
  t.token = token;
  t.max_in_flight = max_in_flight;
  t.tokens_per_second = rate;
  t.burst_tokens = burst;
  return t;
}

/// Admission and the real router with test doubles around them, on a deterministic scheduler.
struct Rig : test::TestSystem {
  TraceP t = std::make_shared<Trace>();
  caf::actor egress, batcher;
  RouterActor router;
  AdmissionActor admission;

  explicit Rig(AdmissionConfig ac, std::shared_ptr<const LlamaModel> model = nullptr,
               std::size_t queue_limit = 100) {
    RouterConfig rc;
    rc.classes = {{"interactive", 0, 1.0, queue_limit, 0}, {"batch", 1, 1.0, queue_limit, 0}};
    egress = sys->spawn(egress_sink, t);
    router = spawn_router(*sys, rc, test::stand_in<EgressActor>(egress));
    admission = spawn_admission(*sys, std::move(ac), rc.classes, "", std::move(model), router,
                                test::stand_in<EgressActor>(egress));
    batcher = sys->spawn(fake_batcher, t);
    sched->run();
  }
  ~Rig() {
    test::stop_all(egress, router, admission, batcher);
    sched->run();
  }

  SubmitRequest req(const std::string& tenant, const std::string& token, const std::string& id,
                    const std::string& client = "c1") {
    SubmitRequest r;
    r.client.identity = client;
    r.tenant = tenant;
    r.token = token;
    r.id = id;
    r.prompt_text = "hello";
    r.max_tokens = 8;
    return r;
  }
  void submit(SubmitRequest r) {
    caf::anon_send(admission, submit_atom::value, std::move(r));
    sched->run();
  }
  void key(uint8_t kind, const std::string& tenant, const std::string& token, const std::string& id,
           const std::string& client = "c1") {
    KeyRequest k;
    k.kind = kind;
    k.client.identity = client;
    k.tenant = tenant;
    k.token = token;
    k.id = id;
    if (kind == KeyRequest::cancel)
      caf::anon_send(admission, cancel_atom::value, std::move(k));
    else
      caf::anon_send(admission, status_atom::value, std::move(k));
    sched->run();
  }
  void credit(uint32_t n) {
    caf::anon_send(batcher, credit_atom::value, router, n);
    sched->run();
  }
  /// The batcher reports a job finished with `completion` tokens.
  void finish(const Job& j, uint32_t completion) {
    JobOutcome o;
    o.uid = j.uid;
    o.id = j.id;
    o.tenant = j.tenant;
    o.outcome = Outcome::done;
    o.tokens_used = static_cast<uint32_t>(j.prompt.size()) + completion;
    o.done.to = j.client;
    o.done.uid = j.uid;
    o.done.id = j.id;
    o.done.tenant = j.tenant;
    o.done.finish = FinishReason::length;
    o.done.text = "done-text";
    o.done.completion_tokens = completion;
    o.done.prompt_tokens = static_cast<uint32_t>(j.prompt.size());
    caf::anon_send(admission, finished_atom::value, std::move(o));
    sched->run();
  }
  template <class R>
  R stats_of(const auto& who) {
    return test::probe_stats<R>(*this, who);
  }
  // An out-of-range code when there is none: it equals no ErrorCode.
  ErrorCode last_error() const {
    return t->errors.empty() ? static_cast<ErrorCode>(255) : t->errors.back().code;
  }
};

AdmissionConfig with_tenants(std::vector<TenantConfig> ts) {
  AdmissionConfig ac;
  ac.allow_anonymous = false;
  ac.tenants = std::move(ts);
  return ac;
}

}  // namespace

BOOST_AUTO_TEST_CASE(token_compare) {
  BOOST_CHECK(tokens_equal("s3cret", "s3cret"));
  BOOST_CHECK(!tokens_equal("s3cret", "s3creT"));
  BOOST_CHECK(!tokens_equal("s3cret", "s3cre"));
  BOOST_CHECK(!tokens_equal("", "x"));
  BOOST_CHECK(tokens_equal("", ""));
}

BOOST_AUTO_TEST_CASE(unknown_tenant_or_wrong_token_is_unauthorized_before_any_queue) {
  Rig rig(with_tenants({tenant("acme", "s3cret")}));
  rig.submit(rig.req("nobody", "s3cret", "j1"));
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::unauthorized);
  rig.submit(rig.req("acme", "wrong", "j1"));
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::unauthorized);
  rig.submit(rig.req("acme", "", "j1"));
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::unauthorized);
  BOOST_CHECK_EQUAL(rig.t->errors.size(), 3u);
  BOOST_CHECK_EQUAL(rig.t->errors[0].to.identity, "c1");
  BOOST_CHECK_EQUAL(rig.stats_of<RouterStats>(rig.router).enqueued, 0);
  BOOST_CHECK_EQUAL(rig.stats_of<AdmissionStats>(rig.admission).unauthorized, 3);
  rig.submit(rig.req("acme", "s3cret", "j1"));
  BOOST_CHECK_EQUAL(rig.t->errors.size(), 3u);
  BOOST_REQUIRE_EQUAL(rig.t->accepted.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->accepted[0].id, "j1");
  BOOST_CHECK_EQUAL(rig.stats_of<RouterStats>(rig.router).enqueued, 1);
  // Cancel and status need the token too.
  rig.key(KeyRequest::cancel, "acme", "bad", "j1");
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::unauthorized);
  rig.key(KeyRequest::status, "acme", "bad", "j1");
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::unauthorized);
  BOOST_CHECK(rig.t->statuses.empty());
}

BOOST_AUTO_TEST_CASE(anonymous_mode_accepts_any_tenant) {
  Rig rig(AdmissionConfig{});
  rig.submit(rig.req("anyone", "", "j1"));
  rig.submit(rig.req("someone-else", "whatever", "j1"));
  BOOST_CHECK(rig.t->errors.empty());
  BOOST_CHECK_EQUAL(rig.t->accepted.size(), 2u);
}

BOOST_AUTO_TEST_CASE(jobs_in_flight_quota) {
  Rig rig(with_tenants({tenant("acme", "", 2)}));
  rig.credit(10);
  rig.submit(rig.req("acme", "", "j1"));
  rig.submit(rig.req("acme", "", "j2"));
  rig.submit(rig.req("acme", "", "j3"));
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->errors[0].code, ErrorCode::rate_limited);
  BOOST_CHECK_EQUAL(rig.t->errors[0].id, "j3");
  BOOST_CHECK_GT(rig.t->errors[0].retry_after_ms, 0);
  BOOST_CHECK_NE(rig.t->errors[0].message.find("limit 2"), std::string::npos);
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 2u);
  rig.finish(rig.t->runs[0], 8);
  rig.submit(rig.req("acme", "", "j3"));
  BOOST_CHECK_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 3u);
}

BOOST_AUTO_TEST_CASE(token_rate_quota_with_retry_after) {
  // 10 tokens/s, bucket of 26: one job of 5 prompt bytes + 8 max_tokens = 13 tokens twice.
  Rig rig(with_tenants({tenant("acme", "", 0, 10, 26)}));
  rig.submit(rig.req("acme", "", "j1"));
  rig.submit(rig.req("acme", "", "j2"));
  BOOST_CHECK(rig.t->errors.empty());
  rig.submit(rig.req("acme", "", "j3"));
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->errors[0].code, ErrorCode::rate_limited);
  // 13 tokens at 10/s: 1.3 s.
  BOOST_CHECK_GE(rig.t->errors[0].retry_after_ms, 1250);
  BOOST_CHECK_LE(rig.t->errors[0].retry_after_ms, 1350);
  rig.sched->clock().current_time += std::chrono::milliseconds(1300);
  rig.submit(rig.req("acme", "", "j3"));
  BOOST_CHECK_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->accepted.size(), 3u);
}

BOOST_AUTO_TEST_CASE(bad_requests_name_the_numbers) {
  AdmissionConfig ac;
  ac.max_prompt_tokens = 8;
  ac.max_output_tokens = 100;
  Rig rig(ac);
  auto r = rig.req("t", "", "long");
  r.prompt_text = "123456789";  // null model: one token per byte
  rig.submit(r);
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->errors[0].code, ErrorCode::bad_request);
  BOOST_CHECK_EQUAL(rig.t->errors[0].message, "prompt has 9 tokens, limit 8");
  r = rig.req("t", "", "cls");
  r.priority = "urgent";
  rig.submit(r);
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::bad_request);
  BOOST_CHECK_NE(rig.t->errors.back().message.find("urgent"), std::string::npos);
  r = rig.req("t", "", "big");
  r.max_tokens = 101;
  rig.submit(r);
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::bad_request);
  BOOST_CHECK_NE(rig.t->errors.back().message.find("101"), std::string::npos);
  r = rig.req("t", "", "empty");
  r.prompt_text = "";
  rig.submit(r);
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::bad_request);
  BOOST_CHECK_EQUAL(rig.t->errors.size(), 4u);
  BOOST_CHECK_EQUAL(rig.stats_of<RouterStats>(rig.router).enqueued, 0);
  // The class is honoured when valid.
  rig.credit(1);
  r = rig.req("t", "", "ok");
  r.priority = "batch";
  rig.submit(r);
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->runs[0].class_index, 1u);
  BOOST_CHECK_EQUAL(rig.t->runs[0].prompt.size(), 5u);
}

BOOST_AUTO_TEST_CASE(model_tokenizes_and_bounds_by_context) {
  std::shared_ptr<const LlamaModel> model = LlamaModel::load(SY_MODELS_DIR "/stories260K.gguf");
  const int ctx = model->config().ctx_len;
  BOOST_REQUIRE_GT(ctx, 16);
  Rig rig(AdmissionConfig{}, model);
  rig.credit(4);
  auto r = rig.req("t", "", "text");
  r.prompt_text = "Once upon a time";
  rig.submit(r);
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 1u);
  BOOST_CHECK(rig.t->runs[0].prompt == model->tokenizer().encode("Once upon a time", true));
  // Prompt + max_tokens beyond the context: max_tokens is lowered to the room that is left.
  r = rig.req("t", "", "ids");
  r.prompt_is_ids = true;
  r.prompt_ids.assign(static_cast<std::size_t>(ctx - 7), 5);
  r.max_tokens = 8;
  rig.submit(r);
  BOOST_CHECK(rig.t->errors.empty());
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 2u);
  BOOST_CHECK_EQUAL(rig.t->runs[1].max_tokens, 7u);
  // A prompt that fills the context still gets one token; one that overflows it is refused,
  // naming the context length.
  r = rig.req("t", "", "full");
  r.prompt_is_ids = true;
  r.prompt_ids.assign(static_cast<std::size_t>(ctx), 5);
  rig.submit(r);
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 3u);
  BOOST_CHECK_EQUAL(rig.t->runs[2].max_tokens, 1u);
  r = rig.req("t", "", "over");
  r.prompt_is_ids = true;
  r.prompt_ids.assign(static_cast<std::size_t>(ctx + 1), 5);
  rig.submit(r);
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->errors[0].code, ErrorCode::bad_request);
  BOOST_CHECK_EQUAL(rig.t->errors[0].message, "prompt has " + std::to_string(ctx + 1) +
                                                  " tokens, limit " + std::to_string(ctx) +
                                                  " (the model's context length)");
  rig.credit(4);
  r = rig.req("t", "", "vocab");
  r.prompt_is_ids = true;
  r.prompt_ids = {1, model->config().n_vocab};
  rig.submit(r);
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::bad_request);
  r = rig.req("t", "", "fits");
  r.prompt_is_ids = true;
  r.prompt_ids.assign(static_cast<std::size_t>(ctx - 8), 5);
  rig.submit(r);
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 4u);
  BOOST_CHECK_EQUAL(rig.t->runs[3].max_tokens, 8u);
}

BOOST_AUTO_TEST_CASE(resubmitted_key_attaches_then_returns_stored_result) {
  Rig rig(AdmissionConfig{});
  rig.credit(10);
  rig.submit(rig.req("acme", "", "k1", "first"));
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 1u);
  // While it runs: the second client is told "accepted" and nothing runs twice.
  rig.submit(rig.req("acme", "", "k1", "second"));
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 1u);
  BOOST_REQUIRE_EQUAL(rig.t->accepted.size(), 2u);
  BOOST_CHECK_EQUAL(rig.t->accepted[1].to.identity, "second");
  // The same id under another tenant is another job.
  rig.submit(rig.req("other", "", "k1", "third"));
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 2u);
  rig.finish(rig.t->runs[0], 8);
  // The attached client gets the result (the first one got it from the batcher).
  BOOST_REQUIRE_EQUAL(rig.t->dones.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->dones[0].to.identity, "second");
  BOOST_CHECK_EQUAL(rig.t->dones[0].text, "done-text");
  // After the end: the stored result, no new run.
  rig.submit(rig.req("acme", "", "k1", "fourth"));
  BOOST_CHECK_EQUAL(rig.t->runs.size(), 2u);
  BOOST_REQUIRE_EQUAL(rig.t->dones.size(), 2u);
  BOOST_CHECK_EQUAL(rig.t->dones[1].to.identity, "fourth");
  BOOST_CHECK_EQUAL(rig.t->dones[1].completion_tokens, 8u);
  BOOST_CHECK_EQUAL(rig.stats_of<AdmissionStats>(rig.admission).deduplicated, 2);
  BOOST_CHECK_EQUAL(rig.stats_of<RouterStats>(rig.router).enqueued, 2);
}

BOOST_AUTO_TEST_CASE(status_of_own_jobs_only) {
  Rig rig(AdmissionConfig{});
  rig.submit(rig.req("acme", "", "a"));
  rig.submit(rig.req("acme", "", "b"));
  rig.credit(1);  // a runs, b waits
  rig.key(KeyRequest::status, "acme", "", "a");
  rig.key(KeyRequest::status, "acme", "", "b");
  BOOST_REQUIRE_EQUAL(rig.t->statuses.size(), 2u);
  BOOST_CHECK_EQUAL(rig.t->statuses[0].state, JobState::running);
  BOOST_CHECK_EQUAL(rig.t->statuses[0].completion_tokens, 3u);  // as its batcher counts them
  BOOST_CHECK_EQUAL(rig.t->statuses[0].tenant, "acme");
  BOOST_CHECK_EQUAL(rig.t->statuses[1].state, JobState::queued);
  BOOST_CHECK_EQUAL(rig.t->statuses[1].id, "b");
  BOOST_CHECK_EQUAL(rig.t->statuses[1].queue_position, 0u);  // nothing waits ahead of it
  rig.finish(rig.t->runs[0], 5);
  rig.key(KeyRequest::status, "acme", "", "a");
  BOOST_REQUIRE_EQUAL(rig.t->statuses.size(), 3u);
  BOOST_CHECK_EQUAL(rig.t->statuses[2].state, JobState::done);
  BOOST_CHECK_EQUAL(rig.t->statuses[2].completion_tokens, 5u);
  // Unknown keys and other tenants' keys look the same: not_found.
  rig.key(KeyRequest::status, "acme", "", "nope");
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::not_found);
  rig.key(KeyRequest::status, "intruder", "", "b");
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::not_found);
  rig.key(KeyRequest::cancel, "intruder", "", "b");
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::not_found);
  BOOST_CHECK_EQUAL(rig.t->errors.size(), 3u);
  BOOST_CHECK_EQUAL(rig.stats_of<RouterStats>(rig.router).cancelled, 0);
}

BOOST_AUTO_TEST_CASE(cancel_queued_job_then_resubmit_returns_its_outcome) {
  Rig rig(with_tenants({tenant("acme", "tok", 1)}));
  rig.submit(rig.req("acme", "tok", "a"));
  rig.key(KeyRequest::cancel, "acme", "tok", "a");
  BOOST_REQUIRE_EQUAL(rig.t->dones.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->dones[0].finish, FinishReason::cancelled);
  BOOST_CHECK_EQUAL(rig.t->dones[0].id, "a");
  rig.key(KeyRequest::status, "acme", "tok", "a");
  BOOST_REQUIRE_EQUAL(rig.t->statuses.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->statuses[0].state, JobState::cancelled);
  // A key runs at most once: resubmitted, the cancelled key answers its stored done (finish
  // cancelled) and runs nothing, without an accepted.
  rig.credit(1);
  const auto accepted = rig.t->accepted.size();
  rig.submit(rig.req("acme", "tok", "a", "c2"));
  BOOST_CHECK(rig.t->errors.empty());
  BOOST_CHECK(rig.t->runs.empty());
  BOOST_CHECK_EQUAL(rig.t->accepted.size(), accepted);
  BOOST_REQUIRE_EQUAL(rig.t->dones.size(), 2u);
  BOOST_CHECK_EQUAL(rig.t->dones[1].finish, FinishReason::cancelled);
  BOOST_CHECK_EQUAL(rig.t->dones[1].to.identity, "c2");
  // The in-flight slot (limit 1) came back: a new key runs.
  rig.submit(rig.req("acme", "tok", "b"));
  BOOST_CHECK(rig.t->errors.empty());
  BOOST_REQUIRE_EQUAL(rig.t->runs.size(), 1u);
  // Cancelling a running job goes through the router to the batcher.
  rig.key(KeyRequest::cancel, "acme", "tok", "b");
  BOOST_REQUIRE_EQUAL(rig.t->batcher_cancels.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->batcher_cancels[0], rig.t->runs[0].uid);
}

BOOST_AUTO_TEST_CASE(full_queue_is_overloaded_and_frees_the_quota) {
  Rig rig(with_tenants({tenant("acme", "", 2)}), nullptr, /*queue_limit=*/1);
  rig.submit(rig.req("acme", "", "a"));
  rig.submit(rig.req("acme", "", "b"));
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->errors[0].code, ErrorCode::overloaded);
  BOOST_CHECK_EQUAL(rig.t->errors[0].id, "b");
  BOOST_CHECK_GE(rig.t->errors[0].retry_after_ms, 20);
  // b's in-flight slot was given back: c is refused by the queue, not by the quota.
  rig.submit(rig.req("acme", "", "c"));
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::overloaded);
  // b was forgotten, so its resubmission is a new job once there is room.
  rig.credit(1);
  rig.submit(rig.req("acme", "", "b"));
  BOOST_CHECK_EQUAL(rig.t->errors.size(), 2u);
  BOOST_CHECK_EQUAL(rig.stats_of<AdmissionStats>(rig.admission).overloaded, 2);
}

BOOST_AUTO_TEST_CASE(deadline_expiry_ends_the_key) {
  Rig rig(AdmissionConfig{});
  auto r = rig.req("acme", "", "d");
  r.deadline_ms = 50;
  rig.submit(r);
  rig.sched->advance_time(std::chrono::milliseconds(60));
  rig.sched->run();
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->errors[0].code, ErrorCode::deadline_exceeded);
  rig.key(KeyRequest::status, "acme", "", "d");
  BOOST_REQUIRE_EQUAL(rig.t->statuses.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->statuses[0].state, JobState::failed);
  BOOST_CHECK_EQUAL(rig.stats_of<AdmissionStats>(rig.admission).active, 0);
  // Resubmitted, the key answers the error it ended with and never runs.
  rig.credit(1);
  rig.submit(rig.req("acme", "", "d", "c2"));
  BOOST_CHECK(rig.t->runs.empty());
  BOOST_REQUIRE_EQUAL(rig.t->errors.size(), 2u);
  BOOST_CHECK_EQUAL(rig.t->errors[1].code, ErrorCode::deadline_exceeded);
  BOOST_CHECK_EQUAL(rig.t->errors[1].to.identity, "c2");
  BOOST_CHECK_EQUAL(rig.t->errors[1].id, "d");
  BOOST_CHECK_EQUAL(rig.t->errors[1].tenant, "acme");
}

BOOST_AUTO_TEST_CASE(drain_refuses_new_work_and_pipeline_credit_returns) {
  Rig rig(with_tenants({tenant("acme", "")}));
  const auto window = rig.t->pull_credit;
  BOOST_CHECK_GT(window, 0u);
  auto r = rig.req("stranger", "", "p1");
  r.client.kind = ClientRef::pipeline;
  r.client.identity.clear();
  rig.submit(r);  // refused by admission: the gateway's credit comes back to the router
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::unauthorized);
  BOOST_CHECK_EQUAL(rig.stats_of<RouterStats>(rig.router).pull_outstanding,
                    static_cast<int64_t>(window) - 1);
  caf::anon_send(rig.admission, drain_atom::value);
  rig.submit(rig.req("acme", "", "late"));
  BOOST_CHECK_EQUAL(rig.last_error(), ErrorCode::unavailable);
}

BOOST_AUTO_TEST_CASE(internal_cancel_needs_no_token_and_gets_no_reply) {
  Rig rig(with_tenants({tenant("acme", "tok")}));
  rig.submit(rig.req("acme", "tok", "a"));
  KeyRequest k;
  k.kind = KeyRequest::cancel;
  k.tenant = "acme";
  k.id = "a";
  k.internal = true;  // the gateway found the client gone
  caf::anon_send(rig.admission, cancel_atom::value, k);
  rig.sched->run();
  BOOST_CHECK(rig.t->errors.empty());
  BOOST_REQUIRE_EQUAL(rig.t->dones.size(), 1u);
  BOOST_CHECK_EQUAL(rig.t->dones[0].finish, FinishReason::cancelled);
  k.id = "unknown";
  caf::anon_send(rig.admission, cancel_atom::value, k);
  rig.sched->run();
  BOOST_CHECK(rig.t->errors.empty());
}

BOOST_AUTO_TEST_SUITE_END()  // test_actors_admission
