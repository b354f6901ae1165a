// `switchyard submit`: runs an offline batch of JSONL jobs through a running server with the C++
// client library: a bounded in-flight window, progress on stderr, resumable output, a summary.
// With --nats the jobs go to a cluster's JetStream queue instead (submit_nats.cpp).
#include "cli/submit.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "cli/json.hpp"
#include "cli/serve.hpp"
#include "clients/cpp/client.hpp"

namespace sy::cli {

const char* const kSubmitUsage =
    "  submit      --input jobs.jsonl --output results.jsonl [--server ADDR] [--window N]\n"
    "              [--tenant NAME] [--token SECRET] [--priority CLASS] [--server-key FILE]\n"
    "              One job per input line: {\"id\": ..., \"prompt\": \"text\" or [ids],\n"
    "              or \"messages\": [{\"role\": ..., \"content\": ...}, ...] (the server's chat\n"
    "              template renders them), \"parse_special\" (a text prompt's special-token\n"
    "              text becomes control tokens), \"max_tokens\": N, \"temperature\", \"top_k\",\n"
    "              \"top_p\", \"seed\", \"stop\", \"ignore_eos\", \"speculative\",\n"
    "              \"priority\", \"deadline_ms\",\n"
    "              \"tenant\", \"logprobs\", \"min_p\", \"presence_penalty\",\n"
    "              \"frequency_penalty\", \"repetition_penalty\", \"repeat_last_n\",\n"
    "              \"logit_bias\", one of \"grammar\", \"json_schema\", \"regex\",\n"
    "              \"choices\", \"n\" (samples; results get \"choices\"),\n"
    "              \"prompt_logprobs\", \"continuations\" (a score request: [text or\n"
    "              ids, ...]; results get \"scores\"), and \"meta\" (yours; not sent)}.\n"
    "              A program (docs/programs.md) replaces \"prompt\": \"program\": [steps]\n"
    "              and \"inputs\": {\"name\": \"text\", ...}; the sampling keys are its gen\n"
    "              steps' defaults; its result line adds \"vars\" and \"steps\". submit\n"
    "              runs no tools: a tool step's call is written as a line {\"id\",\n"
    "              \"tool_call\": {\"call\", \"name\", \"arguments\"}} and the program waits\n"
    "              for a tool_result from another client (with the tenant's token), or\n"
    "              fails with deadline_exceeded after the step's tool_timeout_ms.\n"
    "              Other keys are refused. Ids already in the output are skipped\n"
    "              (resumable); overloaded jobs are retried.\n"
    "              --server-key: the server's CURVE public key file (PREFIX.pub);\n"
    "              [--client-key FILE]: this client's secret key (PREFIX.key) for a server\n"
    "              that admits only listed client keys.\n"
    "              --nats URL[,URL...]: publish to a cluster's JetStream queue instead\n"
    "              (switchyard.jobs.<priority>, default class interactive) and read the\n"
    "              results from a reply subject; [--timeout-ms MS] gives up after MS\n"
    "              without a result (default 60000); [--no-wait] only publishes (no\n"
    "              --output needed); [--cancel ID] (repeatable) publishes cancels of\n"
    "              --tenant's jobs. Exit status 3: the cluster is overloaded (its jobs\n"
    "              stream is full; the jobs after the refused one were not published).\n";
const std::vector<std::string> kSubmitOptions = {"input",      "output", "server",     "window",
                                                 "tenant",     "token",  "priority",   "server-key",
                                                 "client-key", "nats",   "timeout-ms", "cancel"};
const std::vector<std::string> kSubmitFlags = {"no-wait"};

namespace {

using Clock = std::chrono::steady_clock;

// A job line, checked and ready to send.
struct Line {
  size_t line_no = 0;
  wire::Submit submit;
};

// Why a job line is refused: names the input line and the field.
[[noreturn]] void bad_line(size_t n, const std::string& what) {
  throw UsageError("input line " + std::to_string(n) + ": " + what);
}

// The job line's values as nlohmann-json parsed them (integers signed or unsigned, floats apart).
uint64_t get_uint(size_t n, const Json& v, const char* key, uint64_t max) {
  const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() <= max
                  : v.is_number_integer()
                      ? v.get<int64_t>() >= 0 && static_cast<uint64_t>(v.get<int64_t>()) <= max
                      : false;
  if (!ok)
    bad_line(n,
             std::string("'") + key + "' must be an integer in [0, " + std::to_string(max) + "]");
  return v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
}

double get_num(size_t n, const Json& v, const char* key) {
  if (!v.is_number()) bad_line(n, std::string("'") + key + "' must be a number");
  return v.get<double>();
}

std::string get_str(size_t n, const Json& v, const char* key) {
  if (!v.is_string()) bad_line(n, std::string("'") + key + "' must be a string");
  return v.get<std::string>();
}

// One input line into a Submit; the server checks ranges again, this catches typos early.
Line parse_job(size_t n, const std::string& text, const std::string& tenant,
               const std::string& token, const std::string& priority) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    bad_line(n, e.what());
  }
  if (!j.is_object()) bad_line(n, "expected a JSON object");
  Line l;
  l.line_no = n;
  auto& s = l.submit;
  s.tenant = tenant;
  s.token = token;
  s.priority = priority;
  for (const auto& [k, v] : j.items()) {
    if (k == "id") {
      if (v.is_number_integer())
        s.id = v.dump();
      else
        s.id = get_str(n, v, "id");
    } else if (k == "prompt") {
      if (v.is_string()) {
        s.prompt = v.get<std::string>();
      } else if (v.is_array()) {
        std::vector<int32_t> ids;
        for (const auto& e : v)
          ids.push_back(static_cast<int32_t>(get_uint(n, e, "prompt", INT32_MAX)));
        s.prompt = std::move(ids);
      } else {
        bad_line(n, "'prompt' must be a string or an array of token ids");
      }
    } else if (k == "messages") {
      if (!v.is_array() || v.empty())
        bad_line(n, "'messages' must be a non-empty array of {\"role\", \"content\"} objects");
      for (std::size_t i = 0; i < v.size(); ++i) {
        const Json& m = v[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) bad_line(n, "'" + at + "' must be an object");
        const auto role = m.find("role");
        const auto content = m.find("content");
        if (role == m.end()) bad_line(n, "'" + at + "' has no 'role'");
        if (content == m.end()) bad_line(n, "'" + at + "' has no 'content'");
        s.messages.push_back(wire::ChatMessage{get_str(n, *role, (at + ".role").c_str()),
                                               get_str(n, *content, (at + ".content").c_str())});
      }
    } else if (k == "parse_special") {
      if (!v.is_boolean()) bad_line(n, "'parse_special' must be true or false");
      s.parse_special = v.get<bool>();
    } else if (k == "max_tokens") {
      s.max_tokens = static_cast<uint32_t>(get_uint(n, v, "max_tokens", UINT32_MAX));
    } else if (k == "temperature") {
      s.temperature = get_num(n, v, "temperature");
    } else if (k == "top_k") {
      s.top_k = static_cast<uint32_t>(get_uint(n, v, "top_k", INT32_MAX));
    } else if (k == "top_p") {
      s.top_p = get_num(n, v, "top_p");
    } else if (k == "seed") {
      s.seed = get_uint(n, v, "seed", UINT64_MAX / 2);
    } else if (k == "stop") {
      if (v.is_string()) {
        s.stop = {v.get<std::string>()};
      } else if (v.is_array()) {
        for (const auto& e : v) s.stop.push_back(get_str(n, e, "stop"));
      } else {
        bad_line(n, "'stop' must be a string or an array of strings");
      }
    } else if (k == "ignore_eos") {
      if (!v.is_boolean()) bad_line(n, "'ignore_eos' must be true or false");
      s.ignore_eos = v.get<bool>();
    } else if (k == "speculative") {
      s.speculative = get_str(n, v, "speculative");
      if (s.speculative != "auto" && s.speculative != "always" && s.speculative != "off")
        bad_line(n, "'speculative' must be \"auto\", \"always\" or \"off\"");
    } else if (k == "priority") {
      s.priority = get_str(n, v, "priority");
    } else if (k == "tenant") {
      s.tenant = get_str(n, v, "tenant");
    } else if (k == "deadline_ms") {
      s.deadline_ms = static_cast<uint32_t>(get_uint(n, v, "deadline_ms", UINT32_MAX));
    } else if (k == "logprobs") {
      s.logprobs = static_cast<uint32_t>(get_uint(n, v, "logprobs", UINT32_MAX));
    } else if (k == "min_p") {
      s.controls.min_p = static_cast<float>(get_num(n, v, "min_p"));
    } else if (k == "presence_penalty") {
      s.controls.presence_penalty = static_cast<float>(get_num(n, v, "presence_penalty"));
    } else if (k == "frequency_penalty") {
      s.controls.frequency_penalty = static_cast<float>(get_num(n, v, "frequency_penalty"));
    } else if (k == "repetition_penalty") {
      s.controls.repetition_penalty = static_cast<float>(get_num(n, v, "repetition_penalty"));
    } else if (k == "repeat_last_n") {
      if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() > INT32_MAX)
        bad_line(n, "'repeat_last_n' must be an integer in [-1, 2147483647]");
      s.controls.repeat_last_n = static_cast<int32_t>(v.get<int64_t>());
    } else if (k == "logit_bias") {
      if (!v.is_object()) bad_line(n, "'logit_bias' must be an object of token id -> bias");
      for (const auto& [id, b] : v.items()) {
        if (id.empty() || id.size() > 10 ||
            id.find_first_not_of("0123456789") != std::string::npos || std::stoll(id) > INT32_MAX)
          bad_line(n, "'logit_bias' key '" + id + "' is not a token id");
        s.controls.logit_bias.emplace_back(static_cast<int32_t>(std::stoll(id)),
                                           static_cast<float>(get_num(n, b, "logit_bias")));
      }
      std::sort(s.controls.logit_bias.begin(), s.controls.logit_bias.end());
    } else if (k == "grammar" || k == "regex" || k == "json_schema" || k == "choices") {
      if (!s.constraint.empty())
        bad_line(n, "'grammar', 'json_schema', 'regex' and 'choices' exclude each other");
      if (k == "grammar") {
        s.constraint = {Constraint::grammar, get_str(n, v, "grammar"), {}};
      } else if (k == "regex") {
        s.constraint = {Constraint::regex, get_str(n, v, "regex"), {}};
      } else if (k == "json_schema") {
        // A schema object is sent as its JSON text; a string is taken as that text already.
        s.constraint = {
            Constraint::json_schema, v.is_string() ? v.get<std::string>() : v.dump(), {}};
      } else {
        if (!v.is_array()) bad_line(n, "'choices' must be an array of strings");
        s.constraint.kind = Constraint::choices;
        for (const auto& e : v) s.constraint.options.push_back(get_str(n, e, "choices"));
      }
    } else if (k == "n") {
      s.n = static_cast<uint32_t>(get_uint(n, v, "n", UINT32_MAX));
    } else if (k == "prompt_logprobs") {
      s.prompt_logprobs = static_cast<uint32_t>(get_uint(n, v, "prompt_logprobs", UINT32_MAX));
    } else if (k == "continuations") {
      if (!v.is_array()) bad_line(n, "'continuations' must be an array of strings or id arrays");
      s.score = true;
      for (const auto& e : v) {
        if (e.is_string()) {
          s.continuations.emplace_back(e.get<std::string>());
        } else if (e.is_array()) {
          std::vector<int32_t> ids;
          for (const auto& x : e)
            ids.push_back(static_cast<int32_t>(get_uint(n, x, "continuations", INT32_MAX)));
          s.continuations.emplace_back(std::move(ids));
        } else {
          bad_line(n, "'continuations' entries must be strings or arrays of token ids");
        }
      }
    } else if (k == "program") {
      // Sent as its JSON text: the server checks the steps (docs/programs.md), so that this
      // command never lags behind the step types it knows.
      if (!v.is_array() || v.empty()) bad_line(n, "'program' must be a non-empty array of steps");
      s.program = v.dump();
    } else if (k == "inputs") {
      if (!v.is_object()) bad_line(n, "'inputs' must be an object of name -> text");
      for (const auto& [name, value] : v.items())
        s.inputs.emplace_back(name, get_str(n, value, ("inputs." + name).c_str()));
    } else if (k != "meta") {
      // "meta" is the caller's own bookkeeping and travels no further; any other key is
      // refused, so that a misspelt or unsupported field is never silently dropped.
      bad_line(n, "unknown field '" + k +
                      "' (the fields of a job line are listed by "
                      "`switchyard help`; put your own data under \"meta\")");
    }
  }
  if (s.id.empty()) bad_line(n, "missing 'id'");
  if (j.contains("program")) {
    // What belongs to one generation has no meaning for a whole program; the server refuses
    // these too, this names the line.
    for (const char* k : {"prompt", "messages", "continuations", "n", "logprobs", "prompt_logprobs",
                          "ignore_eos", "parse_special"})
      if (j.contains(k)) bad_line(n, std::string("'program' and '") + k + "' exclude each other");
    for (const char* k : {"grammar", "json_schema", "regex", "choices"})
      if (j.contains(k))
        bad_line(n, std::string("'") + k + "' does not go with 'program': a constraint belongs " +
                        "to a gen step");
    return l;
  }
  if (j.contains("inputs")) bad_line(n, "'inputs' goes with 'program' only");
  if (j.contains("prompt") && j.contains("messages"))
    bad_line(n, "'prompt' and 'messages' exclude each other: give one of them");
  if (!j.contains("prompt") && !j.contains("messages"))
    bad_line(n, "missing 'prompt' (or 'messages', or 'program')");
  return l;
}

// Ids already in the output (a result or an error; a program's tool_call line is no result). A
// torn last line (an interrupted run) is cut off so that the file stays one JSON object per line.
std::unordered_set<std::string> done_ids(const std::string& path) {
  std::unordered_set<std::string> ids;
  if (!std::filesystem::exists(path)) return ids;
  std::string all;
  {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    all = ss.str();
  }
  size_t keep = all.rfind('\n');
  keep = keep == std::string::npos ? 0 : keep + 1;
  if (keep != all.size()) {
    std::cerr << "switchyard: dropping a torn last line of " << path << "\n";
    std::filesystem::resize_file(path, keep);
    all.resize(keep);
  }
  std::istringstream in(all);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      auto j = Json::parse(line);
      if (!j.is_object() || j.contains("tool_call")) continue;
      if (auto id = j.find("id"); id != j.end() && id->is_string())
        ids.insert(id->get<std::string>());
    } catch (const Json::exception&) {
      // A line we cannot read names no id: that job simply runs again.
    }
  }
  return ids;
}

// A program's tool call as a line of the output: {"id", "tool_call": {"call", "name",
// "arguments"}}. It is no result: done_ids skips it, so a rerun still runs the program.
std::string tool_call_line(const wire::ToolCall& c) {
  Json j;
  j["id"] = c.id;
  j["tool_call"] = {{"call", c.call}, {"name", c.name}, {"arguments", c.arguments}};
  return json_dump(j);
}

}  // namespace

std::string done_line(const wire::Done& d) {
  Json j;
  j["id"] = d.id;
  j["text"] = d.text;
  j["ids"] = d.ids;
  j["finish_reason"] = wire::to_string(d.finish_reason);
  j["usage"] = {{"prompt_tokens", d.usage.prompt_tokens},
                {"completion_tokens", d.usage.completion_tokens}};
  j["timings"] = {{"queue_ms", d.timings.queue_ms},
                  {"ttft_ms", d.timings.ttft_ms},
                  {"total_ms", d.timings.total_ms}};
  // Present only when the job asked for them, so that a plain job's line is unchanged.
  for (const wire::Choice& c : d.choices)
    j["choices"].push_back({{"index", c.index},
                            {"text", c.text},
                            {"ids", c.ids},
                            {"finish_reason", wire::to_string(c.finish_reason)}});
  for (const wire::PromptLogprob& p : d.prompt_logprobs) {
    Json e = {{"id", p.id}, {"logprob", p.logprob}};
    for (const wire::TopLogprob& t : p.top) e["top"].push_back({t.id, t.logprob});
    j["prompt_logprobs"].push_back(std::move(e));
  }
  for (const wire::Score& sc : d.scores)
    j["scores"].push_back(
        {{"index", sc.index}, {"logprob", sc.logprob}, {"mean", sc.mean}, {"tokens", sc.tokens}});
  // A program's: every input and variable (a join's list as an array), and the steps that ran.
  if (d.steps > 0 || !d.vars.empty()) {
    Json vars = Json::object();
    for (const wire::Var& v : d.vars) {
      if (v.list)
        vars[v.name] = v.values;
      else
        vars[v.name] = v.values.empty() ? std::string() : v.values.front();
    }
    j["vars"] = std::move(vars);
    j["steps"] = d.steps;
  }
  return json_dump(j);
}

std::string error_line(const std::string& id, const wire::Error& e) {
  Json j;
  j["id"] = id;
  j["error"] = {{"code", to_string(e.code)}, {"message", e.message}};
  return json_dump(j);
}

std::string duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm%02lds", t / 3600, t / 60 % 60, t % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

std::string progress_text(size_t finished, size_t total, double secs, uint64_t tokens, double rate,
                          size_t left, bool final, size_t in_flight, size_t failed) {
  double eta = rate > 0 ? left / rate : -1;
  int width = 30, fill = total ? static_cast<int>(width * finished / total) : width;
  char line[256];
  std::snprintf(line, sizeof line,
                "[%s%s] %zu/%zu  %.0f tok/s  %.1f jobs/s  ETA %s  (%zu in flight, %zu failed)",
                std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), finished,
                total, secs > 0 ? tokens / secs : 0.0, rate, final ? "0s" : duration(eta).c_str(),
                in_flight, failed);
  return line;
}

int cmd_submit(const Args& a) {
  const bool nats = a.has("nats");
  if (a.has("server") && nats) throw UsageError("--server and --nats exclude each other");
  for (const char* only : {"no-wait", "timeout-ms", "cancel"})
    if (a.has(only) && !nats) throw UsageError(std::string("--") + only + " needs --nats");
  for (const char* zmq_only : {"server-key", "client-key"})
    if (a.has(zmq_only) && nats)
      throw UsageError(std::string("--") + zmq_only +
                       " is for a server's CURVE endpoint, not --nats");
  if (nats && a.has("cancel")) {
    if (a.has("input")) throw UsageError("--cancel and --input exclude each other");
    return cancel_over_nats(a);
  }
  const bool no_wait = nats && a.has("no-wait");
  std::string in_path = a.str("input"), out_path = a.str("output");
  if (in_path.empty()) throw UsageError("submit needs --input jobs.jsonl");
  if (out_path.empty() && !no_wait) throw UsageError("submit needs --output results.jsonl");
  std::string server = a.str("server", "tcp://127.0.0.1:5555");
  long long window = a.integer("window", 64);
  // The server's queues bound what it holds; beyond 100k a window only hides a stuck server.
  if (window < 1 || window > 100000) throw UsageError("--window must be in [1, 100000]");
  std::string tenant = a.str("tenant", "default");

  // Every line is checked before anything is sent, so a typo on line 900,000 costs nothing.
  std::ifstream in(in_path);
  if (!in) throw UsageError("cannot open --input " + in_path);
  std::vector<Line> jobs;
  std::unordered_set<std::string> seen;
  std::string text;
  for (size_t n = 1; std::getline(in, text); ++n) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    Line l = parse_job(n, text, tenant, a.str("token"), a.str("priority"));
    if (!seen.insert(l.submit.tenant + "\n" + l.submit.id).second)
      bad_line(n, "id '" + l.submit.id + "' appears twice");
    jobs.push_back(std::move(l));
  }
  auto skip = out_path.empty() ? std::unordered_set<std::string>{} : done_ids(out_path);
  std::deque<size_t> todo;
  for (size_t i = 0; i < jobs.size(); ++i)
    if (!skip.count(jobs[i].submit.id)) todo.push_back(i);
  const size_t total = jobs.size(), skipped = total - todo.size();
  if (nats) {
    NatsBatch b;
    for (size_t i : todo) b.todo.push_back(std::move(jobs[i].submit));
    b.total = total;
    b.skipped = skipped;
    b.in_path = in_path;
    b.out_path = out_path;
    b.window = window;
    return submit_over_nats(a, std::move(b));
  }
  std::cerr << "switchyard: " << total << " jobs in " << in_path << ", " << skipped
            << " already in " << out_path << ", " << todo.size() << " to run on " << server << "\n";

  std::ofstream out(out_path, std::ios::app | std::ios::binary);
  if (!out) throw UsageError("cannot open --output " + out_path);
  client::ClientOptions copt;
  if (a.has("server-key")) copt.server_key = client::read_server_key(a.str("server-key"));
  if (a.has("client-key")) {
    if (!a.has("server-key")) throw UsageError("--client-key needs --server-key (CURVE)");
    copt.client_key = client::read_client_key(a.str("client-key"));
  }
  client::Client cl(server, copt);

  std::unordered_map<std::string, size_t> in_flight;  // job id -> index in jobs
  std::multimap<Clock::time_point, size_t> retry_at;  // overloaded jobs, when to resend
  size_t done = 0, failed = 0, retries = 0;
  uint64_t tokens = 0;
  auto t0 = Clock::now();
  auto last_progress = t0 - std::chrono::seconds(10);
  auto last_message = t0;
  const bool tty = isatty(2);
  // After this long without a message the server is pinged: long jobs are fine as long as it
  // answers; no pong within kPingWait means it is gone, and a rerun resumes (job keys make
  // resubmission safe).
  const auto kQuiet = std::chrono::seconds(15);
  const auto kPingWait = std::chrono::seconds(10);

  auto progress = [&](bool final) {
    auto now = Clock::now();
    // A terminal is redrawn 5 times a second; a log file gets a line every 5 seconds.
    if (!final &&
        now - last_progress < (tty ? std::chrono::milliseconds(200) : std::chrono::seconds(5)))
      return;
    last_progress = now;
    // Results reach the file at every progress tick, so an interrupted run loses little.
    out.flush();
    double secs = std::chrono::duration<double>(now - t0).count();
    size_t run = todo.size() + in_flight.size() + retry_at.size();
    size_t finished = done + failed;
    double rate = secs > 0 ? finished / secs : 0;
    const std::string line = progress_text(skipped + finished, total, secs, tokens, rate, run,
                                           final, in_flight.size(), failed);
    std::cerr << (tty ? "\r" : "") << line << (tty && !final ? "" : "\n") << std::flush;
  };

  while (!todo.empty() || !in_flight.empty() || !retry_at.empty()) {
    auto now = Clock::now();
    while (!retry_at.empty() && retry_at.begin()->first <= now) {
      todo.push_front(retry_at.begin()->second);
      retry_at.erase(retry_at.begin());
    }
    while (!todo.empty() && in_flight.size() < static_cast<size_t>(window)) {
      size_t i = todo.front();
      todo.pop_front();
      in_flight[jobs[i].submit.id] = i;
      cl.submit(jobs[i].submit);
    }
    progress(false);
    // Short waits while retries are pending so that they go out on time.
    auto m = cl.next(std::chrono::milliseconds(retry_at.empty() ? 200 : 10));
    if (!m) {
      if (!in_flight.empty() && Clock::now() - last_message > kQuiet) {
        if (!cl.ping_wait(kPingWait)) {
          std::cerr << "\nswitchyard: " << server << " does not answer a ping with "
                    << in_flight.size() << " jobs in flight: giving up (rerun to resume)\n";
          break;
        }
        last_message = Clock::now();
      }
      continue;
    }
    last_message = Clock::now();
    if (auto* d = std::get_if<wire::Done>(&*m)) {
      auto it = in_flight.find(d->id);
      if (it == in_flight.end()) continue;  // a duplicate answer (a resubmitted key)
      in_flight.erase(it);
      tokens += d->usage.completion_tokens;
      out << done_line(*d) << '\n';
      ++done;
    } else if (auto* c = std::get_if<wire::ToolCall>(&*m)) {
      // Written for whoever runs the tool; the program stays in flight until it is answered
      // (by another client) or its tool step times out.
      if (in_flight.count(c->id)) out << tool_call_line(*c) << '\n';
    } else if (auto* e = std::get_if<wire::Error>(&*m)) {
      auto it = in_flight.find(e->id);
      if (it == in_flight.end()) {
        if (e->id.empty()) std::cerr << "\nswitchyard: server error: " << e->message << "\n";
        continue;
      }
      size_t i = it->second;
      in_flight.erase(it);
      if (e->code == ErrorCode::overloaded || e->code == ErrorCode::rate_limited) {
        // The server said when: wait that long (at least 10 ms so a 0 cannot spin).
        auto wait =
            std::chrono::milliseconds(std::max<uint32_t>(10, e->retry_after_ms.value_or(100)));
        retry_at.emplace(Clock::now() + wait, i);
        ++retries;
      } else if (e->code == ErrorCode::bad_request || e->code == ErrorCode::unauthorized ||
                 e->code == ErrorCode::deadline_exceeded || e->code == ErrorCode::not_found) {
        // The job itself is at fault: record the error so a rerun does not repeat it.
        out << error_line(e->id, *e) << '\n';
        ++failed;
      } else {
        // Transient (shutdown, engine lost, cancelled): not recorded, so a rerun retries it.
        std::cerr << (tty ? "\n" : "") << "switchyard: job " << e->id << " failed ("
                  << to_string(e->code) << ": " << e->message << "); rerun to retry it\n";
        ++failed;
      }
    }
  }
  out.flush();
  progress(true);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  size_t lost = in_flight.size() + todo.size() + retry_at.size();
  std::cerr << "switchyard: summary: " << done << " done, " << failed << " failed, " << skipped
            << " skipped (already in the output), " << lost << " not finished; " << tokens
            << " tokens in " << duration(secs) << " (" << (secs > 0 ? tokens / secs : 0.0)
            << " tok/s), " << retries << " overloaded retries\n";
  return failed == 0 && lost == 0 ? 0 : 1;
}

}  // namespace sy::cli
