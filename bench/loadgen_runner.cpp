// One phase of load: open-loop arrivals (Poisson, or bursts at Poisson instants) or a closed loop
// of jobs over a pool of DEALER sockets, recording what the client saw of each job.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/loadgen.hpp"

namespace sy::bench::loadgen {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

ClientSockets::ClientSockets(const std::string& endpoint, int n) {
  for (int i = 0; i < n; ++i)
    clients.push_back(std::make_unique<sy::client::Client>(ctx, endpoint));
  for (auto& c : clients) items.push_back({c->socket().handle(), 0, ZMQ_POLLIN, 0});
  limits.max_message_bytes = 64u << 20;  // a non-streamed done carries the whole completion
  limits.max_string_bytes = 64u << 20;
}

Runner::Runner(const Options& o, const std::string& endpoint, int vocab)
    : o_(o), vocab_(vocab), rng_(o.seed), net_(endpoint, o.sockets) {
  std::vector<double> w;
  for (auto& m : o.mix) w.push_back(m.weight);
  pick_mix_ = std::discrete_distribution<uint32_t>(w.begin(), w.end());
  // Job ids must not collide with keys an external server remembers from earlier runs.
  tag_ = "lg" + std::to_string(std::random_device{}() % 1000000) + "-" + std::to_string(getpid()) +
         "-";
}

std::vector<double> Runner::ping_rtt_ms(int n) {
  std::vector<double> out;
  auto& c = *net_.clients[0];
  for (int i = 0; i < n; ++i) {
    int64_t t = now_ns();
    // A second is far beyond any round trip on loopback: no answer means no server.
    if (!c.ping_wait(std::chrono::milliseconds(1000))) break;
    out.push_back((now_ns() - t) / 1e6);
  }
  return out;
}

RunData Runner::run(const Phase& ph) {
  RunData d;
  // Ids go on across phases: the server remembers finished keys and would answer a reused one
  // from its result cache without running it.
  base_ = next_base_;
  const uint64_t total = ph.jobs ? ph.jobs + ph.warmup : 0;
  if (total) d.jobs.reserve(total);
  uint64_t inflight = 0;
  int64_t t0 = now_ns();
  ArrivalClock arrivals(ph.rate, ph.burst, t0);
  int64_t end_issue = ph.duration_s > 0 ? t0 + static_cast<int64_t>(ph.duration_s * 1e9) : 0;
  int64_t last_msg = t0;
  size_t first_counted = ph.warmup;
  auto can_issue = [&](int64_t now) {
    if (total) return d.jobs.size() < total;
    return d.jobs.size() < ph.warmup || now < end_issue;
  };
  auto issue = [&](int64_t now) {
    size_t idx = d.jobs.size();
    Job& j = d.jobs.emplace_back();
    j.mix = pick_mix_(rng_);
    j.warm = idx < ph.warmup;
    if (idx == first_counted) {
      d.t_start = now;
      // Duration runs count from the end of the warm-up.
      if (ph.duration_s > 0) end_issue = now + static_cast<int64_t>(ph.duration_s * 1e9);
    }
    auto& c = *net_.clients[idx % net_.clients.size()];
    auto s = make_submit(idx, j.mix);
    j.prompt_sent = last_prompt_len_;
    j.t_submit = now_ns();
    c.submit(s);
    ++inflight;
  };
  for (;;) {
    int64_t now = now_ns();
    long timeout_ms = 100;
    if (ph.rate > 0) {
      while (arrivals.next_ns() <= now && can_issue(now)) {
        issue(now);
        if (d.jobs.size() > ph.warmup) d.lag_ms.push_back((now - arrivals.next_ns()) / 1e6);
        arrivals.advance(rng_);
      }
      // zmq_poll counts whole milliseconds: rounding up wakes us at most 1 ms late (the lag is
      // reported, and latencies count from the real send), rather than spinning a core that
      // the server needs on a small machine.
      if (can_issue(now))
        timeout_ms = std::max<int64_t>(1, (arrivals.next_ns() - now + 999999) / 1000000);
    } else {
      while (inflight < static_cast<uint64_t>(ph.concurrency) && can_issue(now)) issue(now);
    }
    if (inflight == 0 && !can_issue(now)) break;
    int n = zmq::poll(net_.items.data(), net_.items.size(), std::chrono::milliseconds(timeout_ms));
    now = now_ns();
    if (n == 0) {
      if (inflight > 0 && now - last_msg > static_cast<int64_t>(o_.timeout_s * 1e9)) {
        d.timed_out = true;
        break;
      }
      continue;
    }
    last_msg = now;
    for (size_t k = 0; k < net_.items.size(); ++k) {
      if (!(net_.items[k].revents & ZMQ_POLLIN)) continue;
      auto& sock = net_.clients[k]->socket();
      zmq::message_t msg;
      while (sock.recv(msg, zmq::recv_flags::dontwait)) {
        int64_t t = now_ns();
        auto dec = sy::wire::decode_server(msg.data(), msg.size(), net_.limits);
        if (auto* e = std::get_if<sy::wire::DecodeError>(&dec))
          throw std::runtime_error("undecodable server message: " + e->message);
        if (handle(d, std::get<sy::wire::ServerMessage>(dec), t)) --inflight;
      }
    }
  }
  next_base_ = base_ + d.jobs.size();
  d.t_end = d.t_start;
  for (size_t i = first_counted; i < d.jobs.size(); ++i)
    d.t_end = std::max(d.t_end, d.jobs[i].t_done);
  return d;
}

sy::wire::Submit Runner::make_submit(size_t idx, uint32_t mix) {
  const MixEntry& m = o_.mix[mix];
  sy::wire::Submit s;
  s.id = tag_ + std::to_string(base_ + idx);
  s.tenant = m.tenant;
  s.token = m.token;
  s.priority = m.cls;
  if (workload_) {
    const sy::bench::PeerRequest& w = workload_->at(idx);
    last_prompt_len_ = static_cast<uint32_t>(w.prompt.size());  // 0 for a text prompt
    s.prompt = w.prompt;
    s.max_tokens = w.max_tokens;
    s.temperature = w.temperature;
    s.seed = w.seed;
    s.ignore_eos = w.ignore_eos;
    s.stream = true;
    return s;
  }
  uint32_t plen = draw_len(o_.prompt, rng_);
  last_prompt_len_ = plen;
  if (o_.prompt_text) {
    std::string text;
    std::uniform_int_distribution<size_t> w(0, std::size(kWords) - 1);
    for (uint32_t i = 0; i < plen; ++i) {
      if (i) text += ' ';
      text += kWords[w(rng_)];
    }
    s.prompt = std::move(text);
  } else {
    std::vector<int32_t> ids(plen);
    std::uniform_int_distribution<int32_t> tok(0, vocab_ - 1);
    for (auto& t : ids) t = tok(rng_);
    s.prompt = std::move(ids);
  }
  s.max_tokens = pick(o_.max_tokens);
  s.temperature = o_.temperature;
  s.seed = base_ + idx;
  s.ignore_eos = o_.ignore_eos;
  s.stream = o_.stream;
  return s;
}

uint32_t Runner::pick(const Range& r) {
  if (r.lo == r.hi) return r.lo;
  return std::uniform_int_distribution<uint32_t>(r.lo, r.hi)(rng_);
}

bool Runner::handle(RunData& d, const sy::wire::ServerMessage& m, int64_t t) {
  const std::string id = sy::client::message_id(m);
  if (id.size() <= tag_.size() || id.compare(0, tag_.size(), tag_) != 0) {
    ++d.unmatched;
    return false;
  }
  size_t n = std::strtoull(id.c_str() + tag_.size(), nullptr, 10);
  if (n < base_) {
    ++d.unmatched;
    return false;
  }
  size_t idx = n - base_;
  if (idx >= d.jobs.size() || d.jobs[idx].finished) {
    ++d.unmatched;
    return false;
  }
  Job& j = d.jobs[idx];
  if (auto* tk = std::get_if<sy::wire::Tokens>(&m)) {
    if (j.t_first == 0)
      j.t_first = t;
    else
      j.itl_ms.push_back(static_cast<float>((t - j.t_last) / 1e6));
    j.t_last = t;
    j.tokens += static_cast<uint32_t>(tk->ids.size());
  } else if (auto* dn = std::get_if<sy::wire::Done>(&m)) {
    j.finished = true;
    j.ok = dn->finish_reason != sy::wire::FinishReason::cancelled;
    j.t_done = t;
    j.server = dn->timings;
    j.tokens = dn->usage.completion_tokens;
    j.prompt_tokens = dn->usage.prompt_tokens;
    return true;
  } else if (auto* er = std::get_if<sy::wire::Error>(&m)) {
    j.finished = true;
    j.error = er->code;
    j.t_done = t;
    return true;
  }
  return false;
}

}  // namespace sy::bench::loadgen
