// The Batch API store (ingress/http_batch): files, batch validation, lines run through a fake
// door (tests call finished()), retries, round-robin, cancel, expiry, recovery after a crash,
// and multipart parsing. Time and timers are the test's: nothing sleeps.
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "ingress/http_batch.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_http_batch)

using namespace sy;
using namespace sy::http_batch;
using json = nlohmann::json;

namespace {

// The door as the store sees it: submits and cancels recorded, timers kept until fire(), a
// clock the test moves.
struct Door {
  std::vector<LineJob> submitted, cancelled;
  std::vector<std::pair<std::chrono::milliseconds, std::function<void()>>> timers;
  int64_t now = 1700000000;
  size_t in_flight = 0, most_in_flight = 0;

  Hooks hooks() {
    Hooks h;
    h.submit = [this](const LineJob& j) {
      submitted.push_back(j);
      most_in_flight = std::max(most_in_flight, ++in_flight);
    };
    h.cancel = [this](const LineJob& j) { cancelled.push_back(j); };
    h.after = [this](std::chrono::milliseconds d, std::function<void()> f) {
      timers.emplace_back(d, std::move(f));
    };
    h.now_s = [this] { return now; };
    return h;
  }
  // Fires the timers set so far; the ones they set wait for the next call.
  void fire() {
    auto due = std::exchange(timers, {});
    for (auto& t : due) t.second();
  }
  // Answers a submitted job.
  void answer(Store& s, const LineJob& j, int status = 200, std::string body = "",
              int64_t retry_after_ms = -1) {
    --in_flight;
    if (body.empty())
      body = status == 200
                 ? json{{"id", "cmpl-" + j.custom_id}, {"object", "chat.completion"}}.dump()
                 : json{{"error",
                         {{"message", "bad"},
                          {"type", "invalid_request_error"},
                          {"code", "bad_thing"}}}}
                       .dump();
    s.finished(j, {status, body, "req-" + j.custom_id, retry_after_ms});
  }
};

// prefix + n, built without `"literal" + std::string&&` (GCC 12 reports a false -Wrestrict).
std::string named(std::string prefix, int n) {
  return prefix += std::to_string(n);
}

std::string request_line(const std::string& cid, const std::string& url = "/v1/chat/completions") {
  return json{{"custom_id", cid},
              {"method", "POST"},
              {"url", url},
              {"body", {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", cid}}}}}}}
      .dump();
}

std::string jsonl(int n, const std::string& prefix = "c") {
  std::string s;
  for (int i = 0; i < n; ++i) s += request_line(named(prefix, i)) + "\n";
  return s;
}

json J(const Reply& r) {
  return json::parse(r.body);
}

std::string upload(Store& s, const std::string& content, const std::string& tenant = "acme") {
  Reply r = s.upload(tenant, "batch", "in.jsonl", content);
  BOOST_REQUIRE_MESSAGE(r.status == 200, r.body);
  return J(r)["id"];
}

json create(Store& s, const std::string& fid, const std::string& window = "24h",
            const std::string& tenant = "acme") {
  Reply r = s.create_batch(tenant, json{{"input_file_id", fid},
                                        {"endpoint", "/v1/chat/completions"},
                                        {"completion_window", window}}
                                       .dump());
  BOOST_REQUIRE_MESSAGE(r.status == 200, r.body);
  return J(r);
}

json batch(Store& s, const std::string& id) {
  return J(s.batch("acme", id));
}

std::vector<json> file_lines(Store& s, const json& fid) {
  std::vector<json> out;
  if (!fid.is_string()) return out;
  Reply r = s.file_content("acme", fid.get<std::string>());
  BOOST_REQUIRE_EQUAL(r.status, 200);
  std::istringstream in(r.body);
  for (std::string l; std::getline(in, l);) out.push_back(json::parse(l));
  return out;
}

Limits small(uint32_t in_flight) {
  Limits l;
  l.max_in_flight = in_flight;
  return l;
}

}  // namespace

BOOST_AUTO_TEST_CASE(files_upload_get_list_content_delete) {
  test::TempDir dir("sy_hb_");
  Door door;
  Limits limits;
  limits.max_file_bytes = 4096;
  limits.max_lines = 5;
  Store s(dir.path(), limits, door.hooks());
  s.recover();
  const std::string content = jsonl(3);
  Reply r = s.upload("acme", "batch", "in.jsonl", content);
  BOOST_REQUIRE_EQUAL(r.status, 200);
  json f = J(r);
  const std::string id = f["id"];
  BOOST_TEST(id.rfind("file-", 0) == 0);
  BOOST_TEST(f["object"] == "file");
  BOOST_TEST(f["bytes"] == content.size());
  BOOST_TEST(f["created_at"] == door.now);
  BOOST_TEST(f["filename"] == "in.jsonl");
  BOOST_TEST(f["purpose"] == "batch");
  BOOST_TEST(f["status"] == "processed");
  BOOST_TEST(J(s.file("acme", id)) == f);
  BOOST_TEST(s.file("other", id).status == 404);
  BOOST_TEST(s.file("acme", "file-nope").status == 404);
  Reply c = s.file_content("acme", id);
  BOOST_TEST(c.content_type == "application/jsonl");
  BOOST_TEST(c.body == content);
  BOOST_TEST(s.file_content("other", id).status == 404);

  const std::string id2 = upload(s, jsonl(1));
  json list = J(s.list_files("acme"));
  BOOST_TEST(list["object"] == "list");
  BOOST_REQUIRE_EQUAL(list["data"].size(), 2u);
  BOOST_TEST(list["data"][0]["id"] == id2);  // newest first
  BOOST_TEST(list["first_id"] == id2);
  BOOST_TEST(list["last_id"] == id);
  BOOST_TEST(list["has_more"] == false);
  BOOST_TEST(J(s.list_files("other"))["data"].empty());

  json bad = J(s.upload("acme", "fine-tune", "x.jsonl", content));
  BOOST_TEST(bad["error"]["param"] == "purpose");
  BOOST_TEST(s.upload("acme", "batch", "x", std::string(5000, 'x')).status == 400);
  BOOST_TEST(J(s.upload("acme", "batch", "x", jsonl(6)))["error"]["param"] == "file");
  BOOST_TEST(s.upload("acme", "batch", "x", "\n \n").status == 400);

  BOOST_TEST(s.delete_file("other", id).status == 404);
  json del = J(s.delete_file("acme", id));
  BOOST_TEST(del["deleted"] == true);
  BOOST_TEST(del["id"] == id);
  BOOST_TEST(s.file("acme", id).status == 404);
  BOOST_TEST(s.delete_file("acme", id).status == 404);

  // The files are kept: a new store on the folder finds the one left.
  Store again(dir.path(), limits, door.hooks());
  again.recover();
  BOOST_TEST(J(again.file("acme", id2))["bytes"] == jsonl(1).size());
  BOOST_TEST(again.file("acme", id).status == 404);
}

BOOST_AUTO_TEST_CASE(a_batch_runs_every_line_and_writes_the_output_file) {
  test::TempDir dir("sy_hb_");
  Door door;
  Store s(dir.path(), {}, door.hooks());
  s.recover();
  const std::string fid = upload(s, jsonl(3));
  json b = create(s, fid);
  const std::string id = b["id"];
  BOOST_TEST(id.rfind("batch_", 0) == 0);
  BOOST_TEST(b["object"] == "batch");
  BOOST_TEST(b["status"] == "in_progress");
  BOOST_TEST(b["endpoint"] == "/v1/chat/completions");
  BOOST_TEST(b["input_file_id"] == fid);
  BOOST_TEST(b["completion_window"] == "24h");
  BOOST_TEST(b["expires_at"] == door.now + 24 * 3600);
  BOOST_TEST(b["request_counts"] == (json{{"total", 3}, {"completed", 0}, {"failed", 0}}));
  BOOST_TEST(b["output_file_id"].is_null());
  BOOST_TEST(b["errors"].is_null());

  BOOST_REQUIRE_EQUAL(door.submitted.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    const LineJob& j = door.submitted[i];
    BOOST_TEST(j.batch_id == id);
    BOOST_TEST(j.line == i + 1);
    BOOST_TEST(j.custom_id == named("c", int(i)));
    BOOST_TEST(j.tenant == "acme");
    BOOST_TEST(j.key == id + "/" + named("c", int(i)));
    BOOST_TEST((j.endpoint == openai::Endpoint::chat_completions));
    BOOST_TEST(json::parse(j.body) == json::parse(request_line(j.custom_id))["body"]);
  }
  auto jobs = door.submitted;
  door.answer(s, jobs[1]);
  door.answer(s, jobs[0]);
  BOOST_TEST(batch(s, id)["request_counts"]["completed"] == 2);
  door.answer(s, jobs[2]);

  b = batch(s, id);
  BOOST_TEST(b["status"] == "completed");
  BOOST_TEST(b["completed_at"] == door.now);
  BOOST_TEST(b["finalizing_at"] == door.now);
  BOOST_TEST(b["request_counts"] == (json{{"total", 3}, {"completed", 3}, {"failed", 0}}));
  BOOST_TEST(b["error_file_id"].is_null());
  auto out = file_lines(s, b["output_file_id"]);
  BOOST_REQUIRE_EQUAL(out.size(), 3u);
  std::set<std::string> ids;
  for (const auto& l : out) {
    ids.insert(l["id"].get<std::string>());
    BOOST_TEST(l["id"].get<std::string>().rfind("batch_req_", 0) == 0);
    BOOST_TEST(l["error"].is_null());
    BOOST_TEST(l["response"]["status_code"] == 200);
    BOOST_TEST(l["response"]["request_id"] == "req-" + l["custom_id"].get<std::string>());
    BOOST_TEST(l["response"]["body"]["id"] == "cmpl-" + l["custom_id"].get<std::string>());
  }
  BOOST_TEST(ids.size() == 3u);
  BOOST_TEST(out[0]["custom_id"] == "c1");  // in the order the lines finished
  json of = J(s.file("acme", b["output_file_id"]));
  BOOST_TEST(of["purpose"] == "batch_output");
  BOOST_TEST(J(s.list_files("acme"))["data"].size() == 2u);
  BOOST_TEST(s.stats().batches_open == 0u);
  BOOST_TEST(s.stats().lines_done == 3u);
  // A late or repeated result changes nothing.
  s.finished(jobs[0], {200, "{}", "", -1});
  BOOST_TEST(s.stats().lines_done == 3u);
}

BOOST_AUTO_TEST_CASE(broken_lines_go_to_the_error_file_and_the_rest_runs) {
  test::TempDir dir("sy_hb_");
  Door door;
  Store s(dir.path(), {}, door.hooks());
  s.recover();
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  const std::string content =
      request_line("good1") + "\n" + "not json\n" +
      R"({"method":"POST","url":"/v1/chat/completions","body":{}})" + "\n" +
      request_line("wrong_url", "/v1/completions") + "\n" +
      R"({"custom_id":"get","method":"GET","url":"/v1/chat/completions","body":{}})" + "\n" +
      R"({"custom_id":"nobody","method":"POST","url":"/v1/chat/completions","body":"x"})" + "\n" +
      R"({"custom_id":"deep","method":"POST","url":"/v1/chat/completions","body":{"a":)" + deep +
      "}}\n\n" + request_line(std::string(300, 'x')) + "\n" + request_line("good2");
  json b = create(s, upload(s, content));
  const std::string id = b["id"];
  BOOST_TEST(b["request_counts"] == (json{{"total", 9}, {"completed", 0}, {"failed", 7}}));
  BOOST_REQUIRE_EQUAL(door.submitted.size(), 2u);
  BOOST_TEST(door.submitted[0].custom_id == "good1");
  BOOST_TEST(door.submitted[1].custom_id == "good2");
  BOOST_TEST(door.submitted[1].line == 10u);  // physical line numbers (the blank line counts)
  auto jobs = door.submitted;
  door.answer(s, jobs[0]);
  door.answer(s, jobs[1], 400);
  b = batch(s, id);
  BOOST_TEST(b["status"] == "completed");
  BOOST_TEST(b["request_counts"] == (json{{"total", 9}, {"completed", 1}, {"failed", 8}}));
  BOOST_TEST(file_lines(s, b["output_file_id"]).size() == 1u);
  auto err = file_lines(s, b["error_file_id"]);
  BOOST_REQUIRE_EQUAL(err.size(), 8u);
  std::vector<json> cids;
  for (const auto& l : err) cids.push_back(l["custom_id"]);
  BOOST_TEST(cids[0].is_null());  // not json
  BOOST_TEST(cids[1].is_null());  // no custom_id
  BOOST_TEST(cids[2] == "wrong_url");
  BOOST_TEST(cids[3] == "get");
  BOOST_TEST(cids[4] == "nobody");
  BOOST_TEST(cids[5].is_null());  // nested too deep to be read
  BOOST_TEST(cids[6].is_null());  // too long a custom_id
  BOOST_TEST(err[0]["response"].is_null());
  BOOST_TEST(err[0]["error"]["message"].get<std::string>().find("line 2") != std::string::npos);
  const json& failed = err[7];  // the line that ran and got a 400
  BOOST_TEST(failed["custom_id"] == "good2");
  BOOST_TEST(failed["response"]["status_code"] == 400);
  BOOST_TEST(failed["error"] == (json{{"code", "bad_thing"}, {"message", "bad"}}));
  BOOST_TEST(s.stats().lines_failed == 8u);
}

BOOST_AUTO_TEST_CASE(a_duplicate_custom_id_fails_the_batch) {
  test::TempDir dir("sy_hb_");
  Door door;
  Store s(dir.path(), {}, door.hooks());
  s.recover();
  json b = create(s, upload(s, jsonl(2) + request_line("c1") + "\n"));
  BOOST_TEST(b["status"] == "failed");
  BOOST_TEST(b["failed_at"] == door.now);
  BOOST_TEST(b["errors"]["object"] == "list");
  BOOST_REQUIRE_EQUAL(b["errors"]["data"].size(), 1u);
  const json& e = b["errors"]["data"][0];
  BOOST_TEST(e["code"] == "duplicate_custom_id");
  BOOST_TEST(e["param"] == "custom_id");
  BOOST_TEST(e["line"] == 3);
  BOOST_TEST(door.submitted.empty());
  BOOST_TEST(s.stats().batches_open == 0u);
  BOOST_TEST(s.cancel_batch("acme", b["id"]).status == 409);
}

BOOST_AUTO_TEST_CASE(create_batch_checks_its_request) {
  test::TempDir dir("sy_hb_");
  Door door;
  Limits limits;
  limits.max_open_batches = 1;
  Store s(dir.path(), limits, door.hooks());
  s.recover();
  const std::string fid = upload(s, jsonl(1));
  auto make = [&](json body, const std::string& tenant = "acme") {
    return s.create_batch(tenant, body.dump());
  };
  const json good = {
      {"input_file_id", fid}, {"endpoint", "/v1/chat/completions"}, {"completion_window", "24h"}};
  auto param = [](const Reply& r) { return J(r)["error"]["param"]; };
  BOOST_TEST(s.create_batch("acme", "{nope").status == 400);
  BOOST_TEST(s.create_batch("acme", "[]").status == 400);
  json b = good;
  b["endpoint"] = "/v1/embeddings";
  BOOST_TEST(param(make(b)) == "endpoint");
  for (const char* w : {"25", "0h", "169h", "h", "24hh", "-1h"}) {
    b = good;
    b["completion_window"] = w;
    BOOST_TEST(param(make(b)) == "completion_window", w);
  }
  b = good;
  b["metadata"] = {{"k", 1}};
  BOOST_TEST(param(make(b)) == "metadata");
  b["metadata"] = json::object();
  for (int i = 0; i < 17; ++i) b["metadata"][named("k", i)] = "v";
  BOOST_TEST(param(make(b)) == "metadata");
  b = good;
  b["input_file_id"] = "file-unknown";
  BOOST_TEST(make(b).status == 404);
  BOOST_TEST(make(good, "other").status == 404);

  b = good;
  b["completion_window"] = "48h";
  b["metadata"] = {{"job", "nightly"}};
  Reply r = make(b);
  BOOST_REQUIRE_EQUAL(r.status, 200);
  BOOST_TEST(J(r)["metadata"] == b["metadata"]);
  BOOST_TEST(J(r)["expires_at"] == door.now + 48 * 3600);
  Reply full = make(good);
  BOOST_TEST(full.status == 429);
  BOOST_TEST(J(full)["error"]["code"] == "too_many_open_batches");
  // The input of a running batch stays.
  BOOST_TEST(s.delete_file("acme", fid).status == 409);
}

BOOST_AUTO_TEST_CASE(a_rate_limited_line_is_submitted_again_after_its_delay) {
  test::TempDir dir("sy_hb_");
  Door door;
  Store s(dir.path(), {}, door.hooks());
  s.recover();
  const std::string id = create(s, upload(s, jsonl(1)))["id"];
  BOOST_REQUIRE_EQUAL(door.submitted.size(), 1u);
  door.timers.clear();  // the expiry timer: not this test's
  door.answer(s, door.submitted[0], 429, R"({"error":{"message":"busy"}})", 250);
  BOOST_TEST(door.submitted.size() == 1u);  // not at once
  BOOST_TEST(s.stats().lines_retried == 1u);
  BOOST_TEST(s.stats().lines_in_flight == 0u);
  BOOST_REQUIRE_EQUAL(door.timers.size(), 1u);
  BOOST_TEST(door.timers[0].first.count() == 250);
  door.fire();
  BOOST_REQUIRE_EQUAL(door.submitted.size(), 2u);
  BOOST_TEST(door.submitted[1].key == door.submitted[0].key);
  door.answer(s, door.submitted[1], 503);  // no hint: a second
  BOOST_TEST(door.timers.back().first.count() == 1000);
  door.fire();
  BOOST_REQUIRE_EQUAL(door.submitted.size(), 3u);
  door.answer(s, door.submitted[2]);
  json b = batch(s, id);
  BOOST_TEST(b["status"] == "completed");
  BOOST_TEST(b["request_counts"] == (json{{"total", 1}, {"completed", 1}, {"failed", 0}}));
  BOOST_TEST(s.stats().lines_retried == 2u);
}

BOOST_AUTO_TEST_CASE(open_batches_take_turns) {
  test::TempDir dir("sy_hb_");
  Door door;
  Store s(dir.path(), small(1), door.hooks());
  s.recover();
  const std::string a = create(s, upload(s, jsonl(3, "a")))["id"];
  const std::string b = create(s, upload(s, jsonl(3, "b")))["id"];
  while (door.in_flight) door.answer(s, door.submitted.back());
  std::vector<std::string> order;
  for (const auto& j : door.submitted) order.push_back(j.custom_id);
  const std::vector<std::string> want = {"a0", "b0", "a1", "b1", "a2", "b2"};
  BOOST_TEST(order == want, boost::test_tools::per_element());
  BOOST_TEST(batch(s, a)["status"] == "completed");
  BOOST_TEST(batch(s, b)["status"] == "completed");
}

BOOST_AUTO_TEST_CASE(max_in_flight_is_never_exceeded) {
  test::TempDir dir("sy_hb_");
  Door door;
  Store s(dir.path(), small(4), door.hooks());
  s.recover();
  std::vector<std::string> ids;
  for (int k = 0; k < 3; ++k) ids.push_back(create(s, upload(s, jsonl(10, named("k", k))))["id"]);
  door.timers.clear();
  std::set<std::string> busy_once;
  size_t next = 0, answered = 0;
  for (int round = 0; round < 1000 && answered < 30; ++round) {
    if (next < door.submitted.size()) {
      // Answers in submit order; every third answer is a 429 (once per line).
      const LineJob j = door.submitted[next++];
      const bool busy = next % 3 == 0 && busy_once.insert(j.key).second;
      door.answer(s, j, busy ? 429 : 200, busy ? "{}" : "", busy ? 5 : -1);
      answered += !busy;
    } else {
      door.fire();  // the retries come due
    }
    BOOST_TEST(s.stats().lines_in_flight <= 4u);
  }
  BOOST_TEST(answered == 30u);
  BOOST_TEST(s.stats().lines_retried == busy_once.size());
  BOOST_TEST(door.most_in_flight == 4u);
  for (const auto& id : ids) BOOST_TEST(batch(s, id)["request_counts"]["completed"] == 10);
}

BOOST_AUTO_TEST_CASE(a_door_that_answers_inside_submit_runs_every_line) {
  // A resubmitted key whose result the journal holds may be answered at once, from inside
  // submit: the store must neither recurse without bound nor lose a line.
  test::TempDir dir("sy_hb_");
  Door door;
  Store* store = nullptr;
  Hooks h = door.hooks();
  size_t answered = 0;
  h.submit = [&](const LineJob& j) {
    ++answered;
    store->finished(j, {200, "{}", "", -1});
  };
  Store s(dir.path(), small(4), h);
  store = &s;
  s.recover();
  const std::string id = create(s, upload(s, jsonl(200)))["id"];
  BOOST_TEST(answered == 200u);
  json b = batch(s, id);
  BOOST_TEST(b["status"] == "completed");
  BOOST_TEST(b["request_counts"]["completed"] == 200);
  BOOST_TEST(s.stats().lines_in_flight == 0u);
}

BOOST_AUTO_TEST_CASE(cancel_stops_a_running_batch) {
  test::TempDir dir("sy_hb_");
  Door door;
  Store s(dir.path(), small(2), door.hooks());
  s.recover();
  const std::string id = create(s, upload(s, jsonl(5)))["id"];
  door.answer(s, door.submitted[0]);       // c0 done, c2 submitted
  door.answer(s, door.submitted[1], 429);  // c1 waits for its retry, c3 submitted
  BOOST_REQUIRE_EQUAL(door.submitted.size(), 4u);
  json b = J(s.cancel_batch("acme", id));
  BOOST_TEST(b["status"] == "cancelling");
  BOOST_TEST(b["cancelling_at"] == door.now);
  BOOST_REQUIRE_EQUAL(door.cancelled.size(), 2u);
  BOOST_TEST(door.cancelled[0].custom_id == "c2");
  BOOST_TEST(door.cancelled[1].key == id + "/c3");
  door.fire();  // c1's retry: not submitted any more
  BOOST_TEST(door.submitted.size() == 4u);
  BOOST_TEST(J(s.cancel_batch("acme", id))["status"] == "cancelling");
  door.answer(s, door.submitted[2]);  // c2 finished before the cancel reached it: kept
  BOOST_TEST(batch(s, id)["status"] == "cancelling");
  door.answer(s, door.submitted[3], 499);  // c3 was cancelled: not an outcome
  b = batch(s, id);
  BOOST_TEST(b["status"] == "cancelled");
  BOOST_TEST(b["cancelled_at"] == door.now);
  BOOST_TEST(b["request_counts"] == (json{{"total", 5}, {"completed", 2}, {"failed", 0}}));
  BOOST_TEST(file_lines(s, b["output_file_id"]).size() == 2u);
  BOOST_TEST(b["error_file_id"].is_null());
  BOOST_TEST(s.cancel_batch("acme", id).status == 200);  // cancelled already: as it is
  BOOST_TEST(s.cancel_batch("other", id).status == 404);
  BOOST_TEST(door.submitted.size() == 4u);

  const std::string done = create(s, upload(s, jsonl(1)))["id"];
  door.answer(s, door.submitted.back());
  Reply r = s.cancel_batch("acme", done);
  BOOST_TEST(r.status == 409);
  BOOST_TEST(J(r)["error"]["type"] == "invalid_request_error");
}

BOOST_AUTO_TEST_CASE(a_batch_not_finished_in_its_window_expires) {
  test::TempDir dir("sy_hb_");
  Door door;
  Store s(dir.path(), small(1), door.hooks());
  s.recover();
  const std::string id = create(s, upload(s, jsonl(3)), "1h")["id"];
  door.answer(s, door.submitted[0]);
  door.fire();  // the expiry timer, early: the time has not come
  BOOST_TEST(batch(s, id)["status"] == "in_progress");
  door.now += 3600;
  door.fire();
  BOOST_REQUIRE_EQUAL(door.cancelled.size(), 1u);
  BOOST_TEST(door.cancelled[0].custom_id == "c1");
  door.answer(s, door.submitted[1], 499);
  json b = batch(s, id);
  BOOST_TEST(b["status"] == "expired");
  BOOST_TEST(b["expired_at"] == door.now);
  BOOST_TEST(b["request_counts"] == (json{{"total", 3}, {"completed", 1}, {"failed", 2}}));
  auto err = file_lines(s, b["error_file_id"]);
  BOOST_REQUIRE_EQUAL(err.size(), 2u);
  BOOST_TEST(err[0]["custom_id"] == "c1");
  BOOST_TEST(err[1]["error"]["code"] == "batch_expired");
  BOOST_TEST(file_lines(s, b["output_file_id"]).size() == 1u);
  BOOST_TEST(door.submitted.size() == 2u);
}

BOOST_AUTO_TEST_CASE(recover_runs_only_the_unfinished_lines_with_the_same_keys) {
  test::TempDir dir("sy_hb_");
  Door door;
  std::string id, fid;
  std::vector<LineJob> first;
  {
    Store s(dir.path(), small(3), door.hooks());
    s.recover();
    id = create(s, upload(s, jsonl(6)))["id"];
    door.answer(s, door.submitted[0]);
    door.answer(s, door.submitted[1], 400);
    first = door.submitted;  // c0, c1 done; c2, c3, c4 in flight
    BOOST_REQUIRE_EQUAL(first.size(), 5u);
  }             // kill -9: the sync timer never fired
  door.fire();  // the old store's timers find it gone
  // A torn result: the crash came in the middle of a write.
  std::ofstream(dir.file("batches/" + id + ".out.jsonl"), std::ios::app)
      << R"({"id":"batch_req_x","custom_id":"c2","resp)";

  Door door2;
  Store s(dir.path(), small(3), door2.hooks());
  s.recover();
  json b = batch(s, id);
  BOOST_TEST(b["status"] == "in_progress");
  BOOST_TEST(b["request_counts"] == (json{{"total", 6}, {"completed", 1}, {"failed", 1}}));
  const std::string out = test::read_file(dir.file("batches/" + id + ".out.jsonl"));
  BOOST_TEST(std::count(out.begin(), out.end(), '\n') == 1);
  BOOST_TEST(out.back() == '\n');
  BOOST_REQUIRE_EQUAL(door2.submitted.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    BOOST_TEST(door2.submitted[i].custom_id == first[i + 2].custom_id);
    BOOST_TEST(door2.submitted[i].key == first[i + 2].key);
    BOOST_TEST(door2.submitted[i].body == first[i + 2].body);
  }
  // A result for a line written before the crash is ignored.
  s.finished(first[0], {500, "{}", "", -1});
  s.finished(first[1], {200, "{}", "", -1});
  BOOST_TEST(s.stats().lines_done == 0u);
  while (door2.in_flight)
    door2.answer(s, door2.submitted[door2.submitted.size() - door2.in_flight]);
  b = batch(s, id);
  BOOST_TEST(b["status"] == "completed");
  BOOST_TEST(b["request_counts"] == (json{{"total", 6}, {"completed", 5}, {"failed", 1}}));
  std::set<std::string> cids;
  for (const auto& l : file_lines(s, b["output_file_id"])) cids.insert(l["custom_id"]);
  for (const auto& l : file_lines(s, b["error_file_id"])) cids.insert(l["custom_id"]);
  BOOST_TEST(cids.size() == 6u);
  BOOST_TEST(door2.submitted.size() == 4u);  // c2, c3, c4 again, then c5
}

BOOST_AUTO_TEST_CASE(recover_finishes_cancels_expiries_and_publishing_cut_short) {
  test::TempDir dir("sy_hb_");
  Door door;
  std::string cancelling, expiring, publishing;
  {
    Store s(dir.path(), small(9), door.hooks());
    s.recover();
    cancelling = create(s, upload(s, jsonl(2, "x")))["id"];
    expiring = create(s, upload(s, jsonl(2, "y")), "2h")["id"];
    publishing = create(s, upload(s, jsonl(2, "z")))["id"];
    for (const auto& j : std::vector<LineJob>(door.submitted))
      if (j.custom_id == "x0" || j.custom_id == "y0" || j.custom_id == "z0") door.answer(s, j);
    s.cancel_batch("acme", cancelling);
  }
  // The crash came after `publishing` recorded its end (the meta says what it reaches) and
  // before its files were published.
  const std::string meta_path = dir.file("batches/" + publishing + ".json");
  json meta = json::parse(test::read_file(meta_path));
  meta["status"] = "finalizing";
  meta["closing"] = "completed";
  meta["out_fid"] = "file-00000000000000000000000a";
  std::ofstream(meta_path) << meta.dump();

  Door door2;
  door2.now = door.now + 2 * 3600;
  Store s(dir.path(), small(9), door2.hooks());
  s.recover();
  BOOST_TEST(door2.submitted.empty());
  json c = batch(s, cancelling);
  BOOST_TEST(c["status"] == "cancelled");
  BOOST_TEST(c["request_counts"] == (json{{"total", 2}, {"completed", 1}, {"failed", 0}}));
  json e = batch(s, expiring);
  BOOST_TEST(e["status"] == "expired");
  BOOST_TEST(e["request_counts"] == (json{{"total", 2}, {"completed", 1}, {"failed", 1}}));
  BOOST_TEST(file_lines(s, e["error_file_id"])[0]["error"]["code"] == "batch_expired");
  json p = batch(s, publishing);
  BOOST_TEST(p["status"] == "completed");
  BOOST_TEST(p["output_file_id"] == "file-00000000000000000000000a");
  BOOST_TEST(file_lines(s, p["output_file_id"]).size() == 1u);
  BOOST_TEST(s.stats().batches_open == 0u);
  // Nothing of theirs is left among the running batches' files.
  for (const auto& ent : std::filesystem::directory_iterator(dir.file("batches")))
    BOOST_TEST(ent.path().extension() == ".json", ent.path());
}

BOOST_AUTO_TEST_CASE(list_batches_pages_newest_first) {
  test::TempDir dir("sy_hb_");
  Door door;
  Store s(dir.path(), {}, door.hooks());
  s.recover();
  const std::string fid = upload(s, jsonl(1));
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(create(s, fid)["id"]);
  json page = J(s.list_batches("acme", "", 2));
  BOOST_TEST(page["object"] == "list");
  BOOST_REQUIRE_EQUAL(page["data"].size(), 2u);
  BOOST_TEST(page["first_id"] == ids[2]);
  BOOST_TEST(page["last_id"] == ids[1]);
  BOOST_TEST(page["has_more"] == true);
  page = J(s.list_batches("acme", page["last_id"], 2));
  BOOST_REQUIRE_EQUAL(page["data"].size(), 1u);
  BOOST_TEST(page["data"][0]["id"] == ids[0]);
  BOOST_TEST(page["has_more"] == false);
  BOOST_TEST(J(s.list_batches("other", "", 0))["data"].empty());
  BOOST_TEST(J(s.list_batches("acme", "batch_unknown", 0))["data"].empty());
  BOOST_TEST(s.batch("other", ids[0]).status == 404);
}

BOOST_AUTO_TEST_CASE(a_long_custom_id_gets_a_hashed_key) {
  test::TempDir dir("sy_hb_");
  Door door;
  Store s(dir.path(), {}, door.hooks());
  s.recover();
  const std::string cid(200, 'q');
  const std::string id = create(s, upload(s, request_line(cid) + "\n"))["id"];
  BOOST_REQUIRE_EQUAL(door.submitted.size(), 1u);
  const std::string& key = door.submitted[0].key;
  BOOST_TEST(key.size() <= 128u);
  BOOST_TEST(key.rfind(id + "#", 0) == 0);
  BOOST_TEST(door.submitted[0].custom_id == cid);
}

BOOST_AUTO_TEST_CASE(multipart_bodies) {
  const std::string ct = "multipart/form-data; boundary=XyZ";
  const std::string body =
      "preamble\r\n--XyZ\r\n"
      "Content-Disposition: form-data; name=\"purpose\"\r\n\r\n"
      "batch\r\n--XyZ\r\n"
      "content-disposition: form-data; name=\"file\"; filename=\"in; \\\"x\\\".jsonl\"\r\n"
      "Content-Type: application/jsonl\r\n\r\n"
      "{\"a\":1}\r\n{\"b\":2}\n\r\n--XyZ--\r\n";
  auto r = parse_multipart(ct, body);
  BOOST_REQUIRE_MESSAGE(std::holds_alternative<std::vector<Part>>(r),
                        (r.index() ? std::get<std::string>(r) : std::string()));
  const auto& parts = std::get<std::vector<Part>>(r);
  BOOST_REQUIRE_EQUAL(parts.size(), 2u);
  BOOST_TEST(parts[0].name == "purpose");
  BOOST_TEST(parts[0].data == "batch");
  BOOST_TEST(parts[1].name == "file");
  BOOST_TEST(parts[1].filename == "in; \"x\".jsonl");
  BOOST_TEST(parts[1].content_type == "application/jsonl");
  BOOST_TEST(parts[1].data == "{\"a\":1}\r\n{\"b\":2}\n");
  // A quoted boundary, no preamble.
  auto q = parse_multipart("Multipart/Form-Data; charset=utf-8; BOUNDARY=\"a b\"",
                           "--a b\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n--a b--");
  BOOST_REQUIRE(std::holds_alternative<std::vector<Part>>(q));
  BOOST_TEST(std::get<std::vector<Part>>(q)[0].name == "x");

  auto error = [](std::string_view c, std::string_view b) {
    auto v = parse_multipart(c, b);
    return std::holds_alternative<std::string>(v) ? std::get<std::string>(v) : std::string();
  };
  BOOST_TEST(!error("multipart/form-data", body).empty());  // no boundary
  BOOST_TEST(!error("application/json; boundary=XyZ", body).empty());
  BOOST_TEST(!error("multipart/form-data; boundary=other", body).empty());
  for (size_t cut : {size_t(20), size_t(60), body.size() - 12, body.size() - 7})
    BOOST_TEST(!error(ct, body.substr(0, cut)).empty(), cut);
  BOOST_TEST(error(ct, body.substr(0, body.size() - 12)).find("truncated") != std::string::npos);
  BOOST_TEST(
      !error(ct, "--XyZ\r\nContent-Type: text/plain\r\n\r\nx\r\n--XyZ--").empty());  // no name
  std::string many;
  for (int i = 0; i < 17; ++i)
    many += "--XyZ\r\nContent-Disposition: form-data; name=p\r\n\r\nv\r\n";
  BOOST_TEST(!error(ct, many + "--XyZ--").empty());
  BOOST_TEST(!error(ct, "--XyZ\r\nX: " + std::string(9000, 'h') + "\r\n\r\nv\r\n--XyZ--").empty());
}

BOOST_AUTO_TEST_SUITE_END()
