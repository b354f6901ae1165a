// bench_programs: three LLM flows run as programs (one submit each, docs/programs.md) and as what
// a client does today (one submit per step, resending the growing text), alternating in one run
// against one spawned `switchyard serve` with the prefix cache on. Prints one JSON object: prefill
// tokens computed, prefix reuse, per-step TTFT, flows/s per workload and mode, and the ratios.
//
//   bench_programs [--model FILE] [--switchyard PATH | --server ADDR] [--threads N] [--rounds R]
//                  [--flows N] [--concurrency C] [--warmup N] [--workloads rag,fork,chat]
//                  [--timeout-s S] [--seed N] [--tenant NAME] [--token SECRET]
//                  [-- more serve args]
//
// Workloads (bench/README.md, bench_programs, defines them and the per-step TTFT):
//   rag   select among 4 intents, a tool step answered by this process (a ~300-token passage),
//         gen 64 tokens
//   fork  a ~512-token document, fork n=4 × gen 48, join as a list, a judge gen of 8 tokens
//   chat  4 turns "User: ...\nAssistant:" of 32 generated tokens each
//
// How to break it: `-- --no-prefix-cache` leaves programs only their saved round trips;
// --concurrency 64 on a 2-core machine turns every TTFT into queueing.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "clients/cpp/client.hpp"
#include "ingress/codec.hpp"
#include "model/gguf.hpp"
#include "model/model.hpp"
#include "model/tokenizer.hpp"
#include "tests/support/server_process.hpp"

namespace sy::bench::programs {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // keys in the order written

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* const kUsage =
    "usage: bench_programs [--model FILE] [--switchyard PATH | --server ADDR] [--threads N]\n"
    "                      [--rounds R] [--flows N] [--concurrency C] [--warmup N]\n"
    "                      [--workloads rag,fork,chat] [--timeout-s S] [--seed N]\n"
    "                      [--tenant NAME] [--token SECRET] [-- more serve args]\n"
    "  --model       GGUF model (default ../shared/models/stories260K.gguf); its tokenizer sizes\n"
    "                the texts, and a spawned server serves it\n"
    "  --switchyard  the server binary (default: BUILD/switchyard next to BUILD/bench/)\n"
    "  --server      use a running server's request endpoint instead of spawning one\n"
    "  --threads     the spawned server's --threads (default 2)\n"
    "  --rounds      rounds of programs-then-independent per workload (default 3)\n"
    "  --flows       flows per workload, mode and round (default 32)\n"
    "  --concurrency flows in flight (default 16)\n"
    "  --warmup      uncounted flows per workload and mode before round 1 (default 4)\n"
    "  --timeout-s   give up after this long without a server message (default 120)\n";

struct Options {
  std::string model = "../shared/models/stories260K.gguf";
  std::string switchyard;
  std::string server;
  int threads = 2;
  int rounds = 3;
  int flows = 32;
  int concurrency = 16;
  int warmup = 4;
  std::vector<std::string> workloads = {"rag", "fork", "chat"};
  double timeout_s = 120;
  uint64_t seed = 1;
  std::string tenant = "bench";
  std::string token;
  std::vector<std::string> serve_args;
};

long long to_int(const std::string& flag, const std::string& v, long long lo, long long hi) {
  try {
    size_t used = 0;
    long long n = std::stoll(v, &used);
    if (used == v.size() && n >= lo && n <= hi) return n;
  } catch (const std::exception&) {
  }
  throw UsageError(flag + " must be an integer in [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "]");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      o.serve_args.assign(argv + i + 1, argv + argc);
      break;
    }
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (i + 1 >= argc) throw UsageError(a + " needs a value (or is unknown)");
    const std::string v = argv[++i];
    if (a == "--model") {
      o.model = v;
    } else if (a == "--switchyard") {
      o.switchyard = v;
    } else if (a == "--server") {
      o.server = v;
    } else if (a == "--threads") {
      o.threads = static_cast<int>(to_int(a, v, 0, 1024));
    } else if (a == "--rounds") {
      o.rounds = static_cast<int>(to_int(a, v, 1, 1000));
    } else if (a == "--flows") {
      o.flows = static_cast<int>(to_int(a, v, 1, 1000000));
    } else if (a == "--concurrency") {
      o.concurrency = static_cast<int>(to_int(a, v, 1, 4096));
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(to_int(a, v, 0, 1000000));
    } else if (a == "--workloads") {
      o.workloads.clear();
      std::stringstream ss(v);
      for (std::string w; std::getline(ss, w, ',');) {
        if (w != "rag" && w != "fork" && w != "chat")
          throw UsageError("--workloads: unknown workload '" + w + "' (rag, fork, chat)");
        o.workloads.push_back(w);
      }
      if (o.workloads.empty()) throw UsageError("--workloads is empty");
    } else if (a == "--timeout-s") {
      o.timeout_s = static_cast<double>(to_int(a, v, 1, 86400));
    } else if (a == "--seed") {
      o.seed = static_cast<uint64_t>(to_int(a, v, 0, INT64_MAX));
    } else if (a == "--tenant") {
      o.tenant = v;
    } else if (a == "--token") {
      o.token = v;
    } else {
      throw UsageError("unknown option '" + a + "'");
    }
  }
  if (!o.server.empty() && !o.switchyard.empty())
    throw UsageError("--server and --switchyard exclude each other");
  return o;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer: seeds that differ in one bit differ
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// ---- texts ------------------------------------------------------------------------------------

// Words of the stories the default model was trained on, so that its tokenizer keeps them short
// and its answers stay text; any model works (its tokenizer sizes the texts).
const char* const kWords[] = {
    "once",  "upon",  "a",     "time",  "there",  "was",  "little", "girl",   "named", "lily",
    "she",   "loved", "to",    "play",  "in",     "the",  "park",   "with",   "her",   "dog",
    "one",   "day",   "saw",   "big",   "red",    "ball", "and",    "happy",  "sun",   "tree",
    "went",  "home",  "mom",   "said",  "friend", "toy",  "box",    "cat",    "bird",  "fish",
    "water", "sky",   "blue",  "green", "jump",   "run",  "smile",  "help",   "share", "kind",
    "look",  "found", "small", "boy",   "tom",    "ben",  "garden", "flower", "cake",  "rain"};

/// Random words of a given length in the model's tokens (texts are plain words, so the count is
/// what the server computes, up to a token or two at the joints).
class Texts {
 public:
  explicit Texts(std::unique_ptr<Tokenizer> tok) : tok_(std::move(tok)) {}

  bool exact() const { return tok_ != nullptr; }

  /// The token count of `text` (BOS not counted); without a tokenizer 1.5 tokens a word.
  uint32_t count(const std::string& text) const {
    if (tok_) return static_cast<uint32_t>(tok_->encode(text, false).size());
    size_t words = std::count(text.begin(), text.end(), ' ') + 1;
    return static_cast<uint32_t>(words * 3 / 2);
  }

  /// `n` random words of `rng`, space-separated.
  static std::string words(std::mt19937_64& rng, size_t n) {
    std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
    std::string s;
    for (size_t i = 0; i < n; ++i) {
      if (i) s += ' ';
      s += kWords[pick(rng)];
    }
    return s;
  }

  /// Random words (from `seed`) of at least `tokens` tokens, over by a word at most.
  std::string of_tokens(uint64_t seed, uint32_t tokens) const {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
    std::string s;
    size_t n = 0;
    uint32_t have = 0;
    while (have < tokens) {
      // Words still missing, at the tokens-per-word ratio seen so far: two or three passes.
      size_t add = have == 0 ? std::max<size_t>(1, tokens / 2)
                             : std::max<size_t>(1, (tokens - have) * n / have);
      for (size_t i = 0; i < add; ++i, ++n) {
        if (n) s += ' ';
        s += kWords[pick(rng)];
      }
      have = count(s);
    }
    return s;
  }

 private:
  std::unique_ptr<Tokenizer> tok_;
};

// ---- the workloads ----------------------------------------------------------------------------

enum class Kind { rag, fork, chat };
enum class Mode { programs, independent };

const char* name(Kind k) {
  return k == Kind::rag ? "rag" : k == Kind::fork ? "fork" : "chat";
}
const char* name(Mode m) {
  return m == Mode::programs ? "programs" : "independent";
}

// The sizes of docs/README's workloads; every figure of the JSON is for these.
constexpr uint32_t kQuestionWords = 12;
const std::vector<std::string> kIntents = {" search", " chat", " weather", " math"};
constexpr uint32_t kPassageTokens = 300;
constexpr uint32_t kAnswerTokens = 64;
constexpr uint32_t kDocTokens = 512;
constexpr uint32_t kBranches = 4;
constexpr uint32_t kDraftTokens = 48;
constexpr uint32_t kJudgeTokens = 8;
constexpr double kDraftTemperature = 0.8;  // branches that sample differently
constexpr uint32_t kTurns = 4;
constexpr uint32_t kUserWords = 12;
constexpr uint32_t kReplyTokens = 32;

/// The tool of the rag workload: a passage of ~kPassageTokens tokens, a pure function of the
/// arguments, so that both modes append the same text.
std::string passage_for(const Texts& texts, const std::string& arguments) {
  return " " + texts.of_tokens(fnv1a(arguments), kPassageTokens);
}

/// One flow's own data: its inputs (the same in both modes, drawn from its seed).
struct FlowSpec {
  uint64_t seed = 0;
  std::vector<std::pair<std::string, std::string>> inputs;
  std::string passage;  // rag: what the tool answers for this flow's question
};

FlowSpec make_spec(Kind k, uint64_t seed, const Texts& texts) {
  FlowSpec f;
  f.seed = seed;
  std::mt19937_64 rng(seed);
  switch (k) {
    case Kind::rag: {
      const std::string q = Texts::words(rng, kQuestionWords);
      f.inputs = {{"question", q}};
      f.passage = passage_for(texts, q);
      break;
    }
    case Kind::fork:
      f.inputs = {{"doc", texts.of_tokens(mix64(seed), kDocTokens)}};
      break;
    case Kind::chat:
      for (uint32_t t = 1; t <= kTurns; ++t)
        f.inputs.emplace_back("u" + std::to_string(t), Texts::words(rng, kUserWords));
      break;
  }
  return f;
}

std::string input(const FlowSpec& f, const std::string& key) {
  for (const auto& [k, v] : f.inputs)
    if (k == key) return v;
  throw std::logic_error("no input " + key);
}

/// The program of a workload (the same JSON for every flow; the inputs differ).
std::string program_json(Kind k) {
  Json p = Json::array();
  switch (k) {
    case Kind::rag:
      p.push_back({{"type", "text"}, {"text", "Question: {{question}}\nIntent:"}});
      p.push_back({{"type", "select"}, {"name", "intent"}, {"choices", kIntents}});
      p.push_back({{"type", "text"}, {"text", "\nPassage:"}});
      p.push_back({{"type", "tool"},
                   {"name", "passage"},
                   {"tool", "search"},
                   {"arguments", "{{question}}"}});
      p.push_back({{"type", "text"}, {"text", "\nAnswer:"}});
      p.push_back({{"type", "gen"}, {"name", "answer"}, {"max_tokens", kAnswerTokens}});
      break;
    case Kind::fork:
      p.push_back({{"type", "text"}, {"text", "Document: {{doc}}\n"}});
      p.push_back({{"type", "fork"},
                   {"n", kBranches},
                   {"steps",
                    {{{"type", "text"}, {"text", "Summary:"}},
                     {{"type", "gen"}, {"name", "draft"}, {"max_tokens", kDraftTokens}}}}});
      p.push_back({{"type", "join"}, {"mode", "list"}, {"name", "drafts"}, {"var", "draft"}});
      p.push_back({{"type", "text"}, {"text", "Drafts:\n{{drafts}}\nBest draft:"}});
      p.push_back(
          {{"type", "gen"}, {"name", "verdict"}, {"max_tokens", kJudgeTokens}, {"temperature", 0}});
      break;
    case Kind::chat:
      for (uint32_t t = 1; t <= kTurns; ++t) {
        const std::string u = std::to_string(t);
        p.push_back(
            {{"type", "text"},
             {"text", std::string(t > 1 ? "\n" : "") + "User: {{u" + u + "}}\nAssistant:"}});
        p.push_back({{"type", "gen"}, {"name", "a" + u}, {"max_tokens", kReplyTokens}});
      }
      break;
  }
  return p.dump();
}

/// A step whose TTFT a program flow records: its path, its label in the report, and the events
/// after which its inputs exist ("" the submit, "step:P" step P's event, "tool:P" the
/// tool_result for call P sent); the latest of them counts.
struct Measured {
  std::string path;
  std::string label;
  std::vector<std::string> after;
};

std::vector<Measured> measured_steps(Kind k) {
  std::vector<Measured> m;
  switch (k) {
    case Kind::rag:
      m = {{"1", "select", {""}}, {"5", "answer", {"tool:3"}}};
      break;
    case Kind::fork: {
      Measured judge{"4", "judge", {}};
      for (uint32_t b = 0; b < kBranches; ++b) {
        const std::string path = "1." + std::to_string(b) + ".1";
        m.push_back({path, "branch", {""}});
        judge.after.push_back("step:" + path);
      }
      m.push_back(std::move(judge));
      break;
    }
    case Kind::chat:
      for (uint32_t t = 0; t < kTurns; ++t)
        m.push_back({std::to_string(2 * t + 1),
                     t == 0 ? "turn1" : "later_turns",
                     {t == 0 ? "" : "step:" + std::to_string(2 * t - 1)}});
      break;
  }
  return m;
}

// ---- the tool worker --------------------------------------------------------------------------

/// Runs the rag workload's tool on a thread and socket of its own, as a separate tool service
/// would (a tool_result may come from any client of the tenant): takes tool_calls from the main
/// loop, answers each with its passage, and hands back when each answer was sent.
class ToolWorker {
 public:
  struct Answered {
    std::string id;  // the program's
    std::string call;
    int64_t t_sent = 0;
  };

  ToolWorker(std::string endpoint, std::string token, const Texts& texts)
      : endpoint_(std::move(endpoint)), token_(std::move(token)), texts_(texts) {
    thread_ = std::thread([this] { loop(); });
  }
  ~ToolWorker() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  ToolWorker(const ToolWorker&) = delete;
  ToolWorker& operator=(const ToolWorker&) = delete;

  /// A flow's tool_call, with the passage its flow expects ("" : compute it from the arguments).
  void post(wire::ToolCall call, std::string passage) {
    {
      std::lock_guard<std::mutex> l(mu_);
      in_.push_back({std::move(call), std::move(passage)});
    }
    cv_.notify_one();
  }

  /// The calls answered since the last take().
  std::vector<Answered> take() {
    std::lock_guard<std::mutex> l(mu_);
    return std::exchange(out_, {});
  }

  /// Errors the server sent the tool's socket (a tool_result refused), and the first of them.
  uint64_t errors() const { return errors_.load(); }
  std::string first_error() {
    std::lock_guard<std::mutex> l(mu_);
    return first_error_;
  }

 private:
  struct Job {
    wire::ToolCall call;
    std::string passage;
  };

  void loop() {
    client::Client cl(endpoint_);  // the socket belongs to this thread
    for (;;) {
      std::optional<Job> job;
      {
        std::unique_lock<std::mutex> l(mu_);
        // A short wait: the socket's error replies are read between calls.
        cv_.wait_for(l, std::chrono::milliseconds(20), [&] { return stop_ || !in_.empty(); });
        if (stop_) return;
        if (!in_.empty()) {
          job = std::move(in_.front());
          in_.pop_front();
        }
      }
      if (job) {
        std::string content =
            job->passage.empty() ? passage_for(texts_, job->call.arguments) : job->passage;
        const int64_t t = now_ns();
        {
          // Recorded before the send: the step it unblocks cannot start before this.
          std::lock_guard<std::mutex> l(mu_);
          out_.push_back({job->call.id, job->call.call, t});
        }
        cl.tool_result(job->call, std::move(content), token_);
      }
      while (auto m = cl.next(std::chrono::milliseconds(0))) {
        if (std::holds_alternative<wire::Error>(*m)) {
          ++errors_;
          std::lock_guard<std::mutex> l(mu_);
          if (first_error_.empty()) first_error_ = client::describe(*m);
        }
      }
    }
  }

  std::string endpoint_, token_;
  const Texts& texts_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> in_;
  std::vector<Answered> out_;
  bool stop_ = false;
  std::atomic<uint64_t> errors_{0};
  std::string first_error_;
  std::thread thread_;
};

// ---- one run: one workload in one mode --------------------------------------------------------

/// The client sockets, one per flow in flight, polled together.
struct Net {
  Net(const std::string& endpoint, int n) {
    limits.max_message_bytes = 64u << 20;  // a done with every variable of a program
    limits.max_string_bytes = 64u << 20;
    for (int i = 0; i < n; ++i) {
      clients.push_back(std::make_unique<client::Client>(ctx, endpoint));
      items.push_back({clients.back()->socket().handle(), 0, ZMQ_POLLIN, 0});
    }
  }
  zmq::context_t ctx{1};
  std::vector<std::unique_ptr<client::Client>> clients;
  std::vector<zmq::pollitem_t> items;
  wire::DecodeLimits limits;
};

/// What one run measured.
struct RunResult {
  uint64_t flows = 0, ok = 0, failed = 0, submits = 0;
  uint64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  std::map<std::string, uint64_t> errors;
  std::map<std::string, std::vector<double>> ttft_ms;  // by step label
  uint64_t ttft_missing = 0;                           // measured steps without both times
  uint64_t unmatched = 0;                              // messages naming no request of this run
  double elapsed_s = 0;
  bool timed_out = false;
};

/// One request of an independent flow.
struct Req {
  std::string id, label;
  int64_t t_submit = 0, t_first = 0, t_done = 0;
  std::string text;
  std::optional<wire::Done> done;
};

/// One flow in flight.
struct Flow {
  FlowSpec spec;
  size_t slot = 0;
  bool finished = false, failed = false;
  // programs
  std::string id;
  int64_t t_submit = 0;
  std::map<std::string, int64_t> events;       // "step:P", "tool:P" -> when the client saw it
  std::map<std::string, int64_t> first_token;  // step path -> its first chunk
  // independent
  int stage = 0;
  size_t open = 0;
  std::vector<Req> reqs;  // the current stage's
  std::string ctx;        // the text so far
  std::vector<std::string> drafts;
};

class Run {
 public:
  Run(const Options& o, Net& net, ToolWorker& tools, Kind kind, Mode mode,
      std::vector<FlowSpec> specs, std::string tag)
      : o_(o), net_(net), tools_(tools), kind_(kind), mode_(mode), tag_(std::move(tag)) {
    flows_.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) flows_[i].spec = std::move(specs[i]);
    program_ = program_json(kind);
    measured_ = measured_steps(kind);
  }

  RunResult go() {
    RunResult r;
    r.flows = flows_.size();
    std::vector<size_t> free_slots;
    for (size_t s = net_.clients.size(); s-- > 0;) free_slots.push_back(s);
    size_t next = 0, active = 0;
    const int64_t t_start = now_ns();
    int64_t last_msg = t_start;
    auto finish = [&](size_t fi) {
      Flow& f = flows_[fi];
      f.finished = true;
      --active;
      free_slots.push_back(f.slot);
      (f.failed ? r.failed : r.ok)++;
    };
    while (next < flows_.size() || active > 0) {
      while (active < net_.clients.size() && next < flows_.size()) {
        flows_[next].slot = free_slots.back();
        free_slots.pop_back();
        ++active;
        start(next++, r);
      }
      take_tool_answers();
      const int n = zmq::poll(net_.items.data(), net_.items.size(), std::chrono::milliseconds(50));
      const int64_t now = now_ns();
      if (n == 0) {
        if (now - last_msg > static_cast<int64_t>(o_.timeout_s * 1e9)) {
          r.timed_out = true;
          break;
        }
        continue;
      }
      last_msg = now;
      // Answers sent before this poll returned are in the queue now: a step they unblocked
      // cannot have produced a token yet that this pass reads.
      take_tool_answers();
      for (size_t k = 0; k < net_.items.size(); ++k) {
        if (!(net_.items[k].revents & ZMQ_POLLIN)) continue;
        zmq::message_t msg;
        while (net_.clients[k]->socket().recv(msg, zmq::recv_flags::dontwait)) {
          const int64_t t = now_ns();
          auto dec = wire::decode_server(msg.data(), msg.size(), net_.limits);
          if (auto* e = std::get_if<wire::DecodeError>(&dec))
            throw std::runtime_error("undecodable server message: " + e->message);
          auto& m = std::get<wire::ServerMessage>(dec);
          auto it = route_.find(client::message_id(m));
          if (it == route_.end()) {
            ++r.unmatched;
            continue;
          }
          const auto [fi, ri] = it->second;
          const bool ended =
              mode_ == Mode::programs ? on_program(fi, m, t, r) : on_independent(fi, ri, m, t, r);
          if (ended) finish(fi);
        }
      }
    }
    r.elapsed_s = (now_ns() - t_start) / 1e9;
    for (const Flow& f : flows_)
      if (!f.finished) ++r.errors["unfinished"];
    return r;
  }

 private:
  // The tool worker's answers, by program id (an answer for a flow of an earlier run, which
  // cannot be, would find no route).
  void take_tool_answers() {
    for (auto& a : tools_.take())
      if (auto it = route_.find(a.id); it != route_.end())
        flows_[it->second.first].events["tool:" + a.call] = a.t_sent;
  }

  wire::Submit base_submit(const std::string& id) const {
    wire::Submit s;
    s.id = id;
    s.tenant = o_.tenant;
    s.token = o_.token;
    s.stream = true;
    s.temperature = 0;
    return s;
  }

  void send(Flow& f, const wire::Submit& s, RunResult& r) {
    ++r.submits;
    net_.clients[f.slot]->submit(s);
  }

  void start(size_t fi, RunResult& r) {
    Flow& f = flows_[fi];
    if (mode_ == Mode::programs) {
      f.id = tag_ + "-" + std::to_string(fi);
      wire::Submit s = base_submit(f.id);
      s.program = program_;
      s.inputs = f.spec.inputs;
      s.seed = f.spec.seed;
      if (kind_ == Kind::fork) s.temperature = kDraftTemperature;
      route_[f.id] = {fi, 0};
      f.t_submit = now_ns();
      send(f, s, r);
    } else {
      next_stage(fi, r);
    }
  }

  // A program flow's message; true when it ended the flow.
  bool on_program(size_t fi, wire::ServerMessage& m, int64_t t, RunResult& r) {
    Flow& f = flows_[fi];
    if (auto* tk = std::get_if<wire::Tokens>(&m)) {
      if (!tk->step.empty()) f.first_token.emplace(tk->step, t);
    } else if (auto* st = std::get_if<wire::Step>(&m)) {
      f.events.emplace("step:" + st->step, t);
    } else if (auto* tc = std::get_if<wire::ToolCall>(&m)) {
      if (tc->tenant.empty()) tc->tenant = o_.tenant;
      tools_.post(std::move(*tc), f.spec.passage);
    } else if (auto* d = std::get_if<wire::Done>(&m)) {
      add_usage(d->usage, r);
      // The tool answers are in: the done came after the steps they unblocked.
      for (const Measured& ms : measured_) {
        int64_t ready = 0;
        bool known = true;
        for (const std::string& a : ms.after) {
          if (a.empty()) {
            ready = std::max(ready, f.t_submit);
            continue;
          }
          auto e = f.events.find(a);
          if (e == f.events.end()) {
            known = false;
            break;
          }
          ready = std::max(ready, e->second);
        }
        // A gen's first chunk; a select streams nothing (nor does a gen that ends at once):
        // then its step event is the first sign of its output.
        int64_t first = 0;
        if (auto ft = f.first_token.find(ms.path); ft != f.first_token.end())
          first = ft->second;
        else if (auto e = f.events.find("step:" + ms.path); e != f.events.end())
          first = e->second;
        if (!known || first == 0) {
          ++r.ttft_missing;
          continue;
        }
        r.ttft_ms[ms.label].push_back(std::max<int64_t>(0, first - ready) / 1e6);
      }
      route_.erase(f.id);
      return true;
    } else if (auto* e = std::get_if<wire::Error>(&m)) {
      f.failed = true;
      ++r.errors[error_key(*e)];
      route_.erase(f.id);
      return true;
    }
    return false;
  }

  // An independent flow's request's message; true when it ended the flow.
  bool on_independent(size_t fi, size_t ri, wire::ServerMessage& m, int64_t t, RunResult& r) {
    Flow& f = flows_[fi];
    if (ri >= f.reqs.size()) return false;
    Req& q = f.reqs[ri];
    if (auto* tk = std::get_if<wire::Tokens>(&m)) {
      if (q.t_first == 0) q.t_first = t;
      q.text += tk->text;
      return false;
    }
    if (auto* d = std::get_if<wire::Done>(&m)) {
      q.t_done = t;
      add_usage(d->usage, r);
      if (q.text.empty()) q.text = d->text;  // not streamed (a score request)
      // A score request streams nothing: its done is when its choice is known.
      r.ttft_ms[q.label].push_back(((q.t_first ? q.t_first : t) - q.t_submit) / 1e6);
      q.done = std::move(*d);
    } else if (auto* e = std::get_if<wire::Error>(&m)) {
      q.t_done = t;
      if (!f.failed) ++r.errors[error_key(*e)];
      f.failed = true;
    } else {
      return false;
    }
    route_.erase(q.id);
    if (--f.open > 0) return false;
    if (f.failed) return true;
    return !next_stage(fi, r);
  }

  // Sends an independent flow's next stage: what a client does once the previous answers are in.
  // False when the flow has no stage left.
  bool next_stage(size_t fi, RunResult& r) {
    Flow& f = flows_[fi];
    std::vector<wire::Submit> subs;
    std::vector<std::string> labels;
    const std::string id = tag_ + "-" + std::to_string(fi) + "-" + std::to_string(f.stage) + "-";
    switch (kind_) {
      case Kind::rag:
        if (f.stage == 0) {
          // select = a score request over the 4 intents, the best mean log-probability wins
          f.ctx = "Question: " + input(f.spec, "question") + "\nIntent:";
          std::vector<std::variant<std::string, std::vector<int32_t>>> cont(kIntents.begin(),
                                                                            kIntents.end());
          wire::Submit s = client::score_request(id + "0", o_.tenant, f.ctx, std::move(cont));
          s.token = o_.token;
          subs.push_back(std::move(s));
          labels.push_back("select");
        } else if (f.stage == 1) {
          const auto& scores = f.reqs[0].done->scores;
          size_t best = 0;
          double best_mean = -INFINITY;
          for (const wire::Score& sc : scores)
            if (sc.index < kIntents.size() && sc.mean > best_mean) {
              best_mean = sc.mean;
              best = sc.index;
            }
          // the tool: this client itself, the same passage as the tool worker's
          f.ctx += kIntents[best] + "\nPassage:" + f.spec.passage + "\nAnswer:";
          wire::Submit s = base_submit(id + "0");
          s.prompt = f.ctx;
          s.max_tokens = kAnswerTokens;
          subs.push_back(std::move(s));
          labels.push_back("answer");
        }
        break;
      case Kind::fork:
        if (f.stage == 0) {
          f.ctx = "Document: " + input(f.spec, "doc") + "\n";
          for (uint32_t b = 0; b < kBranches; ++b) {
            wire::Submit s = base_submit(id + std::to_string(b));
            s.prompt = f.ctx + "Summary:";
            s.max_tokens = kDraftTokens;
            s.temperature = kDraftTemperature;
            s.seed = f.spec.seed + b;  // the branches sample differently, as a program's do
            subs.push_back(std::move(s));
            labels.push_back("branch");
          }
        } else if (f.stage == 1) {
          std::string drafts;
          for (size_t b = 0; b < f.reqs.size(); ++b) drafts += (b ? "\n" : "") + f.reqs[b].text;
          wire::Submit s = base_submit(id + "0");
          s.prompt = f.ctx + "Drafts:\n" + drafts + "\nBest draft:";
          s.max_tokens = kJudgeTokens;
          subs.push_back(std::move(s));
          labels.push_back("judge");
        }
        break;
      case Kind::chat:
        if (f.stage > 0) f.ctx += f.reqs[0].text;
        if (f.stage < static_cast<int>(kTurns)) {
          f.ctx += std::string(f.stage > 0 ? "\n" : "") +
                   "User: " + input(f.spec, "u" + std::to_string(f.stage + 1)) + "\nAssistant:";
          wire::Submit s = base_submit(id + "0");
          s.prompt = f.ctx;
          s.max_tokens = kReplyTokens;
          subs.push_back(std::move(s));
          labels.push_back(f.stage == 0 ? "turn1" : "later_turns");
        }
        break;
    }
    if (subs.empty()) return false;
    ++f.stage;
    f.reqs.assign(subs.size(), Req{});
    f.open = subs.size();
    const int64_t t = now_ns();
    for (size_t i = 0; i < subs.size(); ++i) {
      f.reqs[i].id = subs[i].id;
      f.reqs[i].label = labels[i];
      f.reqs[i].t_submit = t;
      route_[subs[i].id] = {fi, i};
      send(f, subs[i], r);
    }
    return true;
  }

  static void add_usage(const wire::Usage& u, RunResult& r) {
    r.prompt_tokens += u.prompt_tokens;
    r.cached_tokens += u.cached_tokens;
    r.completion_tokens += u.completion_tokens;
  }

  static std::string error_key(const wire::Error& e) {
    return std::string(to_string(e.code)) + ": " + e.message.substr(0, 160);
  }

  const Options& o_;
  Net& net_;
  ToolWorker& tools_;
  Kind kind_;
  Mode mode_;
  std::string tag_;
  std::string program_;
  std::vector<Measured> measured_;
  std::vector<Flow> flows_;
  std::unordered_map<std::string, std::pair<size_t, size_t>> route_;  // id -> flow, request
};

// ---- statistics -------------------------------------------------------------------------------

Json num(double v) {
  if (!std::isfinite(v)) return nullptr;
  return std::round(v * 1000) / 1000;
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double at = p * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

double median(std::vector<double> v) {
  return pct(std::move(v), 0.5);
}

Json dist(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return {{"n", v.size()},
          {"p50", num(pct(v, 0.5))},
          {"p99", num(pct(v, 0.99))},
          {"mean", num(v.empty() ? NAN : sum / static_cast<double>(v.size()))}};
}

/// A workload's mode over every round.
struct ModeTotals {
  RunResult sum;                    // counts summed, TTFT samples pooled
  std::vector<double> flows_per_s;  // per round
  std::vector<Json> rounds;
};

std::vector<double> all_ttft(const RunResult& r) {
  std::vector<double> v;
  for (const auto& [label, xs] : r.ttft_ms) v.insert(v.end(), xs.begin(), xs.end());
  return v;
}

Json run_json(const RunResult& r) {
  Json by_step = Json::object();
  for (const auto& [label, xs] : r.ttft_ms) by_step[label] = dist(xs);
  Json errs = Json::object();
  for (const auto& [k, v] : r.errors) errs[k] = v;
  const uint64_t prefill = r.prompt_tokens - std::min(r.prompt_tokens, r.cached_tokens);
  return {{"flows", r.flows},
          {"completed", r.ok},
          {"failed", r.failed},
          {"errors", std::move(errs)},
          {"submits", r.submits},
          {"elapsed_s", num(r.elapsed_s)},
          {"flows_per_s", num(r.elapsed_s > 0 ? r.ok / r.elapsed_s : NAN)},
          {"prompt_tokens", r.prompt_tokens},
          {"cached_tokens", r.cached_tokens},
          {"prefill_tokens", prefill},
          {"prefill_tokens_per_flow", num(r.ok ? static_cast<double>(prefill) / r.ok : NAN)},
          {"reuse_ratio", num(r.prompt_tokens ? static_cast<double>(r.cached_tokens) /
                                                    static_cast<double>(r.prompt_tokens)
                                              : NAN)},
          {"completion_tokens", r.completion_tokens},
          {"step_ttft_ms", dist(all_ttft(r))},
          {"step_ttft_ms_by_step", std::move(by_step)},
          {"ttft_missing", r.ttft_missing},
          {"unmatched_messages", r.unmatched},
          {"timed_out", r.timed_out}};
}

void accumulate(ModeTotals& t, const RunResult& r) {
  RunResult& s = t.sum;
  s.flows += r.flows;
  s.ok += r.ok;
  s.failed += r.failed;
  s.submits += r.submits;
  s.prompt_tokens += r.prompt_tokens;
  s.cached_tokens += r.cached_tokens;
  s.completion_tokens += r.completion_tokens;
  for (const auto& [k, v] : r.errors) s.errors[k] += v;
  for (const auto& [k, v] : r.ttft_ms) s.ttft_ms[k].insert(s.ttft_ms[k].end(), v.begin(), v.end());
  s.ttft_missing += r.ttft_missing;
  s.unmatched += r.unmatched;
  s.elapsed_s += r.elapsed_s;
  s.timed_out |= r.timed_out;
  t.flows_per_s.push_back(r.elapsed_s > 0 ? r.ok / r.elapsed_s : NAN);
  t.rounds.push_back(run_json(r));
}

// ---- main -------------------------------------------------------------------------------------

std::string default_switchyard() {
  // bench_programs lives in BUILD/bench/, the server binary in BUILD/.
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "./switchyard";
  return (self.parent_path().parent_path() / "switchyard").string();
}

/// A temporary directory holding the spawned server's config: only batching.prefix_cache on (the
/// default today, written down so that the figures do not change with the default).
class CacheConfig {
 public:
  CacheConfig() {
    char tmpl[] = "/tmp/bench_programs-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    path_ = (dir_ / "prefix_cache.yaml").string();
    std::ofstream f(path_);
    f << "batching: {prefix_cache: true}\n";
    if (!f) throw std::runtime_error("cannot write " + path_);
  }
  ~CacheConfig() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  CacheConfig(const CacheConfig&) = delete;
  CacheConfig& operator=(const CacheConfig&) = delete;
  const std::string& path() const { return path_; }

 private:
  fs::path dir_;
  std::string path_;
};

std::string resolve_model(const std::string& m) {
  if (fs::exists(m)) return m;
#ifdef SY_BENCH_DIR
  // The default is relative to the repository root; from elsewhere, try beside the sources.
  fs::path beside = fs::path(SY_BENCH_DIR) / ".." / m;
  if (fs::exists(beside)) return fs::weakly_canonical(beside).string();
#endif
  return m;
}

const char* const kTtftDefinition =
    "per-step TTFT: for each gen or select step, the time from when its inputs existed at the "
    "client to its first output. Inputs exist at the program's submit (first steps, fork "
    "branches), at the client's receipt of the previous step's `step` event (later chat turns; "
    "for the judge, the last branch's), or when the tool worker sent the tool_result (the rag "
    "answer). First output: the step's first streamed token chunk (stream=true), or its `step` "
    "event for a select (which streams nothing). Independent mode: from the send of the step's "
    "own submit (sent as soon as the answers it needs arrived) to its first token chunk, or to "
    "the score request's done for select.";

int main_impl(int argc, char** argv) {
  Options o = parse(argc, argv);
  o.model = resolve_model(o.model);
  // The tokenizer sizes the documents and passages; the context length bounds the longest prompt.
  std::unique_ptr<Tokenizer> tok;
  int ctx_len = 0;
  try {
    auto file = gguf::File::open(o.model);
    tok = Tokenizer::from_gguf(file);
    try {
      ctx_len = read_llama_config(file).ctx_len;
    } catch (const std::exception&) {
      // an architecture read_llama_config does not know: the server will say if it is too long
    }
  } catch (const std::exception& e) {
    if (o.server.empty()) throw UsageError("cannot read --model " + o.model + ": " + e.what());
    std::cerr << "bench_programs: warning: no tokenizer from " << o.model << " (" << e.what()
              << "): texts sized at 1.5 tokens a word\n";
  }
  const Texts texts(std::move(tok));
  // The judge's prompt is the longest: the document, every draft and a few words around them.
  const uint32_t longest = kDocTokens + kBranches * (kDraftTokens + 2) + 16 + kJudgeTokens;
  if (ctx_len > 0 && longest > static_cast<uint32_t>(ctx_len))
    throw UsageError("the fork workload needs about " + std::to_string(longest) +
                     " tokens of context; " + o.model + " has " + std::to_string(ctx_len));

  std::optional<CacheConfig> cfg;
  std::unique_ptr<sy::test::ServeProcess> server;
  std::string endpoint = o.server;
  if (endpoint.empty()) {
    cfg.emplace();
    sy::test::ServeOptions so;
    so.binary = o.switchyard.empty() ? default_switchyard() : o.switchyard;
    so.args = {"--bind",    "tcp://127.0.0.1:*",       "--model",  o.model,
               "--threads", std::to_string(o.threads), "--config", cfg->path()};
    so.args.insert(so.args.end(), o.serve_args.begin(), o.serve_args.end());
    so.startup = std::chrono::seconds(180);  // a model load on a busy 2-core machine
    so.death_signal = SIGTERM;
    server = std::make_unique<sy::test::ServeProcess>(so);
    std::cerr << "bench_programs: " << server->ready_line() << "\n";
    endpoint = server->endpoint();
  }

  std::vector<Kind> kinds;
  for (const std::string& w : o.workloads)
    kinds.push_back(w == "rag" ? Kind::rag : w == "fork" ? Kind::fork : Kind::chat);

  Net net(endpoint, o.concurrency);
  ToolWorker tools(endpoint, o.token, texts);
  const std::string tag =
      "bp" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 1000000);
  // Every flow's texts are its own (seeded by workload, round, mode and index), so no flow is
  // served from the cache by another's, nor a mode by the other mode's earlier round.
  auto specs = [&](Kind k, int round, Mode m, int n) {
    std::vector<FlowSpec> v;
    for (int i = 0; i < n; ++i)
      v.push_back(make_spec(
          k,
          mix64(o.seed ^
                mix64((static_cast<uint64_t>(k) << 48) ^ (static_cast<uint64_t>(round + 1) << 32) ^
                      (static_cast<uint64_t>(m) << 24) ^ static_cast<uint64_t>(i))),
          texts));
    return v;
  };
  auto run = [&](Kind k, int round, Mode m, int n) {
    auto s = specs(k, round, m, n);
    const std::string t = tag + "-" + name(k) + "-" + std::to_string(round + 1) + "-" +
                          (m == Mode::programs ? "p" : "i");
    std::cerr << "bench_programs: " << name(k) << " " << name(m)
              << (round < 0 ? " (warm-up)" : " round " + std::to_string(round + 1)) << ": " << n
              << " flows\n";
    return Run(o, net, tools, k, m, std::move(s), t).go();
  };

  // Sizes of the texts as the model's tokenizer counts them (one flow's of each).
  Json sizes = Json::object();
  {
    const FlowSpec rag = make_spec(Kind::rag, 1, texts);
    const FlowSpec fork = make_spec(Kind::fork, 1, texts);
    sizes = {{"exact", texts.exact()},
             {"passage_tokens", texts.count(rag.passage)},
             {"doc_tokens", texts.count(input(fork, "doc"))},
             {"question_tokens", texts.count(input(rag, "question"))}};
  }

  bool timed_out = false;
  for (Kind k : kinds) {
    if (o.warmup == 0) break;
    for (Mode m : {Mode::programs, Mode::independent})
      timed_out |= run(k, -1, m, o.warmup).timed_out;
  }
  std::map<std::pair<Kind, Mode>, ModeTotals> totals;
  for (int round = 0; round < o.rounds && !timed_out; ++round)
    for (Kind k : kinds)
      for (Mode m : {Mode::programs, Mode::independent}) {
        if (timed_out) break;
        RunResult r = run(k, round, m, o.flows);
        timed_out |= r.timed_out;
        accumulate(totals[{k, m}], r);
      }

  Json results = Json::array(), comparison = Json::array();
  bool failed = timed_out || tools.errors() > 0;
  for (Kind k : kinds) {
    for (Mode m : {Mode::programs, Mode::independent}) {
      ModeTotals& t = totals[{k, m}];
      Json j = {{"workload", name(k)}, {"mode", name(m)}};
      Json all = run_json(t.sum);
      for (auto& [key, v] : all.items()) j[key] = v;
      j["flows_per_s"] = num(median(t.flows_per_s));  // the rounds' median
      j["flows_per_s_rounds"] = Json::array();
      for (double x : t.flows_per_s) j["flows_per_s_rounds"].push_back(num(x));
      j["rounds"] = t.rounds;
      failed |= t.sum.failed > 0 || t.sum.ok < t.sum.flows;
      results.push_back(std::move(j));
    }
    const RunResult& p = totals[{k, Mode::programs}].sum;
    const RunResult& i = totals[{k, Mode::independent}].sum;
    auto prefill = [](const RunResult& r) {
      return r.ok ? static_cast<double>(r.prompt_tokens -
                                        std::min(r.prompt_tokens, r.cached_tokens)) /
                        static_cast<double>(r.ok)
                  : NAN;
    };
    const double fewer = 1 - prefill(p) / prefill(i);
    const std::vector<double> pt = all_ttft(p), it = all_ttft(i);
    const double lower50 = 1 - pct(pt, 0.5) / pct(it, 0.5);
    const double lower99 = 1 - pct(pt, 0.99) / pct(it, 0.99);
    // Flows/s: the median over rounds of each round's ratio (both modes of a round ran back to
    // back, under the same machine load).
    std::vector<double> ratio;
    const auto& pf = totals[{k, Mode::programs}].flows_per_s;
    const auto& inf = totals[{k, Mode::independent}].flows_per_s;
    for (size_t r = 0; r < std::min(pf.size(), inf.size()); ++r) ratio.push_back(pf[r] / inf[r]);
    const double speed = median(ratio);
    Json c = {
        {"workload", name(k)},
        {"prefill_tokens_per_flow",
         {{"programs", num(prefill(p))}, {"independent", num(prefill(i))}}},
        {"prefill_fewer", num(fewer)},
        {"prefill_goal", ">= 0.40 fewer"},
        {"prefill_goal_met", fewer >= 0.40},
        {"step_ttft_p50_ms", {{"programs", num(pct(pt, 0.5))}, {"independent", num(pct(it, 0.5))}}},
        {"step_ttft_p99_ms",
         {{"programs", num(pct(pt, 0.99))}, {"independent", num(pct(it, 0.99))}}},
        {"step_ttft_p50_lower", num(lower50)},
        {"step_ttft_p99_lower", num(lower99)},
        {"step_ttft_goal", ">= 0.35 lower (p50)"},
        {"step_ttft_goal_met", lower50 >= 0.35},
        {"flows_per_s_ratio", num(speed)},
        {"flows_per_s_ratio_rounds", Json::array()}};
    for (double x : ratio) c["flows_per_s_ratio_rounds"].push_back(num(x));
    if (k == Kind::fork) {
      c["flows_per_s_goal"] = ">= 1.5x";
      c["flows_per_s_goal_met"] = speed >= 1.5;
    }
    char line[512];
    if (p.ok == 0 || i.ok == 0)
      std::snprintf(line, sizeof line,
                    "bench_programs: %-4s no comparison: a mode completed no flow", name(k));
    else
      std::snprintf(line, sizeof line,
                    "bench_programs: %-4s prefill/flow %.0f vs %.0f (%.0f%% fewer; goal >= 40%%: "
                    "%s), step TTFT p50 %.1f vs %.1f ms (%.0f%% lower; goal >= 35%%: %s), p99 %.1f "
                    "vs %.1f ms, flows/s x%.2f%s",
                    name(k), prefill(p), prefill(i), 100 * fewer, fewer >= 0.40 ? "met" : "NOT met",
                    pct(pt, 0.5), pct(it, 0.5), 100 * lower50, lower50 >= 0.35 ? "met" : "NOT met",
                    pct(pt, 0.99), pct(it, 0.99), speed,
                    k == Kind::fork
                        ? (speed >= 1.5 ? " (goal >= 1.5x: met)" : " (goal >= 1.5x: NOT met)")
                        : "");
    std::cerr << line << "\n";
    comparison.push_back(std::move(c));
  }

  Json out = {{"tool", "bench_programs"},
              {"options",
               {{"model", o.model},
                {"endpoint", endpoint},
                {"spawned", server != nullptr},
                {"threads", o.threads},
                {"prefix_cache", server ? Json("on") : Json("server's setting")},
                {"rounds", o.rounds},
                {"flows", o.flows},
                {"concurrency", o.concurrency},
                {"warmup", o.warmup},
                {"seed", o.seed},
                {"serve_args", o.serve_args},
                {"texts", sizes}}},
              {"ttft_definition", kTtftDefinition},
              {"results", std::move(results)},
              {"comparison", std::move(comparison)},
              {"tool_errors", tools.errors()}};
  if (tools.errors() > 0) out["tool_first_error"] = tools.first_error();
  if (server) {
    // The server answers SIGUSR1 at once; two seconds is plenty even under load.
    if (auto st = server->stats_line(std::chrono::milliseconds(2000))) {
      try {
        out["server_stats"] = Json::parse(*st);
      } catch (const Json::exception&) {
        out["server_stats"] = *st;
      }
    }
    server->stop(SIGTERM, std::chrono::seconds(10));  // all our flows are finished
  }
  std::cout << out.dump(1) << std::endl;
  if (timed_out) std::cerr << "bench_programs: timed out waiting for the server\n";
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace sy::bench::programs

int main(int argc, char** argv) {
  using namespace sy::bench::programs;
  // A server that vanished must not kill us with SIGPIPE while we print.
  signal(SIGPIPE, SIG_IGN);
  try {
    return main_impl(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "bench_programs: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "bench_programs: " << e.what() << "\n";
    return 1;
  }
}
