// bench_loadgen --multi-turn: chat sessions that resend their whole history each turn, for the
// prefix cache's effect on TTFT (optionally with the cache on and off, one server each).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/loadgen.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"

namespace sy::bench::loadgen {
namespace {

/// One turn as the client saw it.
struct Turn {
  uint32_t conv = 0, turn = 0;  // turn counts from 1
  int64_t t_submit = 0, t_first = 0, t_done = 0;
  bool ok = false;
  std::optional<sy::ErrorCode> error;
  sy::wire::Usage usage;
  double server_ttft_ms = 0;
};

/// Chat sessions: each conversation sends turn 1 (a --prompt-len prompt), waits for its
/// completion, then sends its whole history (previous prompt + completion + --user-len new user
/// tokens) as the next prompt, --turns times. All conversations run at once, each with at most
/// one turn in flight, so a prefix cache can serve everything but the newest tokens.
class MultiTurn {
 public:
  MultiTurn(const Options& o, const std::string& endpoint, int vocab)
      : o_(o),
        vocab_(vocab),
        rng_(o.seed),
        net_(endpoint, std::min<int>(o.sockets, static_cast<int>(o.multi_turn))) {
    tag_ = "mt" + std::to_string(std::random_device{}() % 1000000) + "-" +
           std::to_string(getpid()) + "-";
  }

  struct Result {
    std::vector<Turn> turns;
    int64_t t_start = 0, t_end = 0;
    uint64_t unmatched = 0;
    bool timed_out = false;
  };

  Result run() {
    Result r;
    struct Conv {
      std::vector<int32_t> ids;  // the history (ids mode)
      std::string text;          // the history (text mode)
      uint32_t turn = 0;         // turns sent
      size_t current = 0;        // index into r.turns of the turn in flight
      std::vector<int32_t> out_ids;
      std::string out_text;
    };
    std::vector<Conv> convs(o_.multi_turn);
    std::map<std::string, size_t> inflight;  // job id -> conversation
    size_t next_conv = 0;                    // conversations not started yet begin here
    std::vector<size_t> ready;               // conversations whose next turn can go
    r.t_start = now_ns();
    auto send = [&](size_t ci) {
      Conv& c = convs[ci];
      if (c.turn == 0) {
        append_user(c.ids, c.text, draw_len(o_.prompt, rng_));
      } else {
        // The history grows by what the model said and a new user message.
        c.ids.insert(c.ids.end(), c.out_ids.begin(), c.out_ids.end());
        c.text += c.out_text;
        append_user(c.ids, c.text, o_.user_len);
      }
      c.out_ids.clear();
      c.out_text.clear();
      ++c.turn;
      sy::wire::Submit s;
      s.id = tag_ + std::to_string(ci) + "-" + std::to_string(c.turn);
      const MixEntry& m = o_.mix[ci % o_.mix.size()];
      s.tenant = m.tenant;
      s.token = m.token;
      s.priority = m.cls;
      if (o_.prompt_text)
        s.prompt = c.text;
      else
        s.prompt = c.ids;
      s.max_tokens = pick(o_.max_tokens);
      s.temperature = o_.temperature;
      s.seed = ci * 1000003u + c.turn;
      s.ignore_eos = o_.ignore_eos;
      s.stream = o_.stream;
      c.current = r.turns.size();
      Turn& t = r.turns.emplace_back();
      t.conv = static_cast<uint32_t>(ci);
      t.turn = c.turn;
      inflight.emplace(s.id, ci);
      t.t_submit = now_ns();
      net_.clients[ci % net_.clients.size()]->submit(s);
    };
    int64_t last_msg = now_ns();
    for (;;) {
      while (inflight.size() < static_cast<size_t>(o_.concurrency) &&
             (!ready.empty() || next_conv < convs.size())) {
        size_t ci;
        if (!ready.empty()) {
          ci = ready.back();
          ready.pop_back();
        } else {
          ci = next_conv++;
        }
        send(ci);
      }
      if (inflight.empty()) break;
      int n = zmq::poll(net_.items.data(), net_.items.size(), std::chrono::milliseconds(100));
      int64_t now = now_ns();
      if (n == 0) {
        if (now - last_msg > static_cast<int64_t>(o_.timeout_s * 1e9)) {
          r.timed_out = true;
          break;
        }
        continue;
      }
      last_msg = now;
      for (size_t k = 0; k < net_.items.size(); ++k) {
        if (!(net_.items[k].revents & ZMQ_POLLIN)) continue;
        zmq::message_t msg;
        while (net_.clients[k]->socket().recv(msg, zmq::recv_flags::dontwait)) {
          const int64_t t = now_ns();
          auto dec = sy::wire::decode_server(msg.data(), msg.size(), net_.limits);
          if (auto* e = std::get_if<sy::wire::DecodeError>(&dec))
            throw std::runtime_error("undecodable server message: " + e->message);
          const auto& m = std::get<sy::wire::ServerMessage>(dec);
          auto it = inflight.find(sy::client::message_id(m));
          if (it == inflight.end()) {
            ++r.unmatched;
            continue;
          }
          const size_t ci = it->second;
          Conv& c = convs[ci];
          Turn& turn = r.turns[c.current];
          bool ended = false;
          if (auto* tk = std::get_if<sy::wire::Tokens>(&m)) {
            if (turn.t_first == 0) turn.t_first = t;
            c.out_ids.insert(c.out_ids.end(), tk->ids.begin(), tk->ids.end());
            c.out_text += tk->text;
          } else if (auto* dn = std::get_if<sy::wire::Done>(&m)) {
            ended = true;
            turn.ok = dn->finish_reason != sy::wire::FinishReason::cancelled;
            turn.usage = dn->usage;
            turn.server_ttft_ms = dn->timings.ttft_ms;
            if (!dn->ids.empty()) c.out_ids = dn->ids;  // not streamed: the whole completion
            if (!dn->text.empty()) c.out_text = dn->text;
          } else if (auto* er = std::get_if<sy::wire::Error>(&m)) {
            ended = true;
            turn.error = er->code;
          }
          if (!ended) continue;
          turn.t_done = t;
          inflight.erase(it);
          // A failed turn ends its conversation: the next prompt would lack the completion.
          if (turn.ok && c.turn < o_.turns) ready.push_back(ci);
        }
      }
    }
    r.t_end = now_ns();
    return r;
  }

 private:
  void append_user(std::vector<int32_t>& ids, std::string& text, uint32_t n) {
    if (o_.prompt_text) {
      std::uniform_int_distribution<size_t> w(0, std::size(kWords) - 1);
      for (uint32_t i = 0; i < n; ++i) {
        if (!text.empty()) text += ' ';
        text += kWords[w(rng_)];
      }
    } else {
      std::uniform_int_distribution<int32_t> tok(0, vocab_ - 1);
      for (uint32_t i = 0; i < n; ++i) ids.push_back(tok(rng_));
    }
  }

  uint32_t pick(const Range& r) {
    if (r.lo == r.hi) return r.lo;
    return std::uniform_int_distribution<uint32_t>(r.lo, r.hi)(rng_);
  }

  const Options& o_;
  int vocab_;
  std::mt19937_64 rng_;
  ClientSockets net_;
  std::string tag_;
};

/// The JSON of one multi-turn run: TTFT of turn 1 and of later turns, the share of later turns'
/// prompts served from the prefix cache (done.usage.cached_tokens / prompt_tokens), per turn too.
Json multi_turn_json(const Options& o, const MultiTurn::Result& r) {
  struct Acc {
    std::vector<double> ttft, e2e, server_ttft, prompt, cached_frac;
    uint64_t prompt_sum = 0, cached_sum = 0, completed = 0;
  };
  Acc first, later;
  std::vector<Acc> by_turn(o.turns);
  std::map<std::string, uint64_t> errors;
  for (const Turn& t : r.turns) {
    if (t.error) {
      ++errors[std::string(sy::to_string(*t.error))];
      continue;
    }
    if (!t.ok) {
      ++errors[t.t_done ? "cancelled" : "unfinished"];
      continue;
    }
    for (Acc* a : {t.turn == 1 ? &first : &later, &by_turn[t.turn - 1]}) {
      ++a->completed;
      const double e2e = (t.t_done - t.t_submit) / 1e6;
      a->ttft.push_back(t.t_first ? (t.t_first - t.t_submit) / 1e6 : t.server_ttft_ms);
      a->e2e.push_back(e2e);
      a->server_ttft.push_back(t.server_ttft_ms);
      a->prompt.push_back(t.usage.prompt_tokens);
      a->prompt_sum += t.usage.prompt_tokens;
      a->cached_sum += t.usage.cached_tokens;
      if (t.usage.prompt_tokens > 0)
        a->cached_frac.push_back(static_cast<double>(t.usage.cached_tokens) /
                                 t.usage.prompt_tokens);
    }
  }
  auto mean = [](const std::vector<double>& v) -> double {
    if (v.empty()) return NAN;
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  auto acc_json = [&](const Acc& a) {
    return Json{
        {"completed", a.completed},        {"ttft_ms", dist(a.ttft)},
        {"e2e_ms", dist(a.e2e)},           {"server_ttft_ms", dist(a.server_ttft)},
        {"prompt_tokens", dist(a.prompt)}, {"cached_fraction_mean", num(mean(a.cached_frac))},
        {"cached_tokens", a.cached_sum},   {"prompt_tokens_total", a.prompt_sum}};
  };
  Json errs = Json::object();
  for (auto& [k, v] : errors) errs[k] = v;
  Json turns = Json::array();
  for (const Acc& a : by_turn) turns.push_back(acc_json(a));
  return {{"elapsed_s", num((r.t_end - r.t_start) / 1e9)},
          {"timed_out", r.timed_out},
          {"unmatched_messages", r.unmatched},
          {"turns_sent", r.turns.size()},
          {"errors", std::move(errs)},
          {"turn1", acc_json(first)},
          {"later_turns", acc_json(later)},
          {"by_turn", std::move(turns)}};
}

// Longest prompt and context the multi-turn mode will need: the last turn's prompt is the first
// prompt plus, per earlier turn, a completion and a user message.
uint64_t multi_turn_max_prompt(const Options& o) {
  return o.prompt.bounds.hi + uint64_t{o.turns - 1} * (o.max_tokens.hi + o.user_len);
}

}  // namespace

int multi_turn_main(const Options& o, int vocab) {
  if (o.model && !o.prompt_text) {
    try {
      const int ctx = sy::read_llama_config(sy::gguf::File::open(*o.model)).ctx_len;
      const uint64_t need = multi_turn_max_prompt(o) + o.max_tokens.hi;
      if (ctx > 0 && need > static_cast<uint64_t>(ctx))
        throw UsageError("--multi-turn: the last turn needs " + std::to_string(need) +
                         " slots, more than the model's context of " + std::to_string(ctx) +
                         " (lower --turns, --max-tokens, --user-len or --prompt-len)");
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception&) {
      // An unreadable model is the server's problem to report.
    }
  }
  std::vector<std::string> settings;
  if (o.prefix_cache == "both")
    settings = {"on", "off"};
  else
    settings = {o.prefix_cache};  // "" = whatever the server is configured with
  Json out = {{"tool", "bench_loadgen"},
              {"mode", "multi_turn"},
              {"options",
               {{"conversations", o.multi_turn},
                {"turns", o.turns},
                {"user_len", o.user_len},
                {"concurrency", o.concurrency},
                {"max_prompt_tokens", multi_turn_max_prompt(o)},
                {"load", options_json(o, o.server)}}},
              {"loadavg_before", loadavg()},
              {"runs", Json::array()}};
  bool failed = false;
  std::vector<double> p50;  // later turns' client TTFT p50, per setting
  for (size_t i = 0; i < settings.size(); ++i) {
    std::optional<CacheConfig> cfg;
    std::unique_ptr<Spawned> server;
    std::string endpoint = o.server;
    if (o.spawn) {
      std::vector<std::string> args = o.serve_args;
      if (!settings[i].empty()) {
        cfg.emplace(settings[i] == "on");
        args.insert(args.end(), {"--config", cfg->path()});
      }
      server = std::make_unique<Spawned>(o.switchyard.empty() ? default_switchyard() : o.switchyard,
                                         args);
      endpoint = server->endpoint();
    }
    MultiTurn mt(o, endpoint, vocab);
    MultiTurn::Result r = mt.run();
    failed |= r.timed_out;
    std::vector<double> later;
    for (const Turn& t : r.turns)
      if (t.turn >= 2 && t.ok && t.t_first) later.push_back((t.t_first - t.t_submit) / 1e6);
    std::sort(later.begin(), later.end());
    p50.push_back(pct(later, 0.5));
    Json run = {{"prefix_cache", settings[i].empty() ? "server default" : settings[i]},
                {"endpoint", endpoint},
                {"result", multi_turn_json(o, r)}};
    if (server) {
      std::string st = server->stats();
      if (!st.empty()) run["server_stats"] = server_stats(st);
      server->stop();
    }
    out["runs"].push_back(std::move(run));
  }
  if (settings.size() == 2) out["ttft_later_p50_off_over_on"] = num(p50[1] / p50[0]);
  out["loadavg_after"] = loadavg();
  std::cout << dump(out) << std::endl;
  if (failed) std::cerr << "bench_loadgen: timed out waiting for the server\n";
  return failed ? 1 : 0;
}

}  // namespace sy::bench::loadgen
