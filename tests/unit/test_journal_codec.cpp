// The journal's record codec (storage/journal_codec): every field of each record round-trips, the
// records are maps of exactly the named fields (what docs/durability.md lists), an older record
// without some fields decodes with their defaults, and a damaged payload is refused by name.
#include <boost/test/unit_test.hpp>
#include <msgpack.hpp>
#include <set>

#include "storage/journal_codec.hpp"

BOOST_AUTO_TEST_SUITE(test_journal_codec)

using namespace sy;

namespace {

std::set<std::string> keys_of(const std::string& payload) {
  auto oh = msgpack::unpack(payload.data(), payload.size());
  std::set<std::string> keys;
  const auto& m = oh.get().via.map;
  for (uint32_t i = 0; i < m.size; ++i) keys.insert(m.ptr[i].key.as<std::string>());
  return keys;
}

Job sample_job() {
  Job j;
  j.uid = 41;
  j.id = "job-\xc3\xa9";
  j.tenant = "acme";
  j.client.kind = ClientRef::router;
  j.client.identity = std::string("\0\x01\xff", 3);
  j.class_index = 1;
  j.prompt = {1, 2, 30000};
  j.max_tokens = 9;
  j.temperature = 0.25f;
  j.top_k = 40;
  j.top_p = 0.5f;
  j.seed = 1234567890123ull;
  j.stop = {"\n", "END"};
  j.ignore_eos = true;
  j.stream = true;
  j.logprobs = 3;
  j.speculative = SpecMode::off;
  return j;
}

}  // namespace

// A program's accept keeps its steps, inputs and finished steps; a step record its path and output.
BOOST_AUTO_TEST_CASE(program_accept_and_step_records_round_trip) {
  Job j = sample_job();
  j.prompt.clear();
  j.program = R"([{"type":"text","text":"Hi {{who}}"},{"type":"gen","name":"a"}])";
  j.inputs = {{"who", "you"}, {"x", "é"}};
  j.program_done = {{"1", "output of a"}};
  auto d = journal::decode(journal::encode_accept(j, 0));
  BOOST_TEST(d.job.program == j.program);
  BOOST_TEST((d.job.inputs == j.inputs));
  BOOST_TEST((d.job.program_done == j.program_done));
  auto s = journal::decode(journal::encode_step(ProgramStep{41, "2.1.0", "text\n"}));
  BOOST_TEST(static_cast<char>(s.kind) == 'S');
  BOOST_TEST(s.uid == 41u);
  BOOST_TEST(s.path == "2.1.0");
  BOOST_TEST(s.output == "text\n");
}

BOOST_AUTO_TEST_CASE(accept_round_trips_every_field) {
  Job j = sample_job();
  auto rec = journal::encode_accept(j, 1700000000000000);
  auto d = journal::decode(rec);
  BOOST_TEST(static_cast<char>(d.kind) == 'A');
  BOOST_TEST(d.uid == 41u);
  BOOST_TEST(d.deadline_wall_us == 1700000000000000);
  BOOST_TEST(d.job.uid == 41u);
  BOOST_TEST(d.job.id == j.id);
  BOOST_TEST(d.job.tenant == "acme");
  BOOST_TEST((d.job.client == j.client));
  BOOST_TEST(d.job.class_index == 1u);
  BOOST_TEST(d.job.prompt == j.prompt);
  BOOST_TEST(d.job.max_tokens == 9u);
  BOOST_TEST(d.job.temperature == 0.25f);
  BOOST_TEST(d.job.top_k == 40);
  BOOST_TEST(d.job.top_p == 0.5f);
  BOOST_TEST(d.job.seed == 1234567890123ull);
  BOOST_TEST(d.job.stop == j.stop);
  BOOST_TEST(d.job.ignore_eos);
  BOOST_TEST(d.job.stream);
  BOOST_TEST(d.job.logprobs == 3u);
  BOOST_TEST(static_cast<int>(d.job.speculative) == static_cast<int>(SpecMode::off));
  const std::set<std::string> want = {"deadline_wall_us",
                                      "t",
                                      "uid",
                                      "id",
                                      "tenant",
                                      "client",
                                      "class_index",
                                      "prompt",
                                      "max_tokens",
                                      "temperature",
                                      "top_k",
                                      "top_p",
                                      "seed",
                                      "stop",
                                      "ignore_eos",
                                      "stream",
                                      "logprobs",
                                      "controls",
                                      "constraint",
                                      "n",
                                      "prompt_logprobs",
                                      "continuations",
                                      "program",
                                      "inputs",
                                      "program_done",
                                      "speculative"};
  BOOST_TEST(keys_of(rec) == want);
  // No deadline: no field (0 means none).
  auto plain = journal::encode_accept(j, 0);
  BOOST_TEST(keys_of(plain).count("deadline_wall_us") == 0u);
  BOOST_TEST(journal::decode(plain).deadline_wall_us == 0);
}

BOOST_AUTO_TEST_CASE(results_keep_the_event_that_ended_the_job) {
  JobOutcome o;
  o.uid = 7;
  o.id = "a";
  o.tenant = "t";
  o.outcome = Outcome::done;
  o.tokens_used = 12;
  o.done.to.kind = ClientRef::pipeline;
  o.done.uid = 7;
  o.done.id = "a";
  o.done.tenant = "t";
  o.done.text = "hello";
  o.done.ids = {5, 6};
  o.done.prompt_tokens = 10;
  o.done.completion_tokens = 2;
  o.done.cached_tokens = 4;
  o.done.queue_ms = 1.5;
  o.done.ttft_ms = 2.5;
  o.done.total_ms = 3.5;
  o.done.logprob = {-0.5f, -0.25f};
  o.done.n_top = 1;
  o.done.top_ids = {5, 6};
  o.done.top_logprobs = {-0.5f, -0.25f};
  auto rec = journal::encode_result(o);
  BOOST_TEST(keys_of(rec) == (std::set<std::string>{"t", "uid", "id", "tenant", "outcome", "code",
                                                    "tokens_used", "done"}));
  auto d = journal::decode(rec);
  BOOST_TEST(static_cast<char>(d.kind) == 'R');
  BOOST_TEST(d.outcome.uid == 7u);
  BOOST_TEST(d.outcome.tokens_used == 12u);
  BOOST_TEST((d.outcome.done.to.kind == ClientRef::pipeline));
  BOOST_TEST(d.outcome.done.text == "hello");
  BOOST_TEST(d.outcome.done.ids == o.done.ids);
  BOOST_TEST(d.outcome.done.cached_tokens == 4u);
  BOOST_TEST(d.outcome.done.total_ms == 3.5);
  BOOST_TEST(d.outcome.done.logprob == o.done.logprob);
  BOOST_TEST(d.outcome.done.top_ids == o.done.top_ids);

  JobOutcome e;
  e.uid = 8;
  e.id = "b";
  e.tenant = "t";
  e.outcome = Outcome::error;
  e.code = ErrorCode::engine_dead;
  e.error.uid = 8;
  e.error.id = "b";
  e.error.code = ErrorCode::engine_dead;
  e.error.message = "why";
  e.error.retry_after_ms = 250;
  auto erec = journal::encode_result(e);
  BOOST_TEST(keys_of(erec).count("error") == 1u);
  BOOST_TEST(keys_of(erec).count("done") == 0u);
  auto ed = journal::decode(erec);
  BOOST_TEST(ed.outcome.error.message == "why");
  BOOST_TEST(ed.outcome.error.retry_after_ms == 250);
  BOOST_TEST((ed.outcome.error.code == ErrorCode::engine_dead));
  BOOST_TEST((ed.outcome.code == ErrorCode::engine_dead));
  BOOST_TEST((ed.outcome.outcome == Outcome::error));
}

BOOST_AUTO_TEST_CASE(older_records_and_damage) {
  // An accept record of an older version: only kind, uid and id. The rest keeps Job's defaults.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_map(3);
  p.pack("t");
  p.pack("A");
  p.pack("uid");
  p.pack(uint64_t{3});
  p.pack("id");
  p.pack("x");
  auto d = journal::decode(std::string(buf.data(), buf.size()));
  BOOST_TEST(d.job.id == "x");
  BOOST_TEST(d.job.max_tokens == Job{}.max_tokens);
  BOOST_TEST(d.job.temperature == Job{}.temperature);

  auto refused = [](const std::string& payload, const std::string& why) {
    try {
      journal::decode(payload);
    } catch (const std::runtime_error& e) {
      return std::string(e.what()).find(why) != std::string::npos;
    }
    return false;
  };
  msgpack::sbuffer arr;
  msgpack::packer<msgpack::sbuffer>(arr).pack_array(0);
  BOOST_TEST(refused(std::string(arr.data(), arr.size()), "record is not a map"));
  msgpack::sbuffer nokind;
  msgpack::packer<msgpack::sbuffer>(nokind).pack_map(0);
  BOOST_TEST(refused(std::string(nokind.data(), nokind.size()), "record without a kind"));
  msgpack::sbuffer odd;
  msgpack::packer<msgpack::sbuffer> q(odd);
  q.pack_map(1);
  q.pack("t");
  q.pack("Z");
  BOOST_TEST(refused(std::string(odd.data(), odd.size()), "unknown record kind"));
  BOOST_TEST(journal::decode(journal::encode_delivered(9)).uid == 9u);
}

BOOST_AUTO_TEST_SUITE_END()  // test_journal_codec
