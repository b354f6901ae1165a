// Writes a small seed corpus for fuzz_codec: one encoded example of every client and server
// message, with every optional field set, so the fuzzer starts from deep, valid structure.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ingress/codec.hpp"

using namespace sy::wire;

namespace {

void save(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  Submit s;
  s.id = "j1";
  s.tenant = "acme";
  s.token = "tok";
  s.prompt = std::string("Once upon a time");
  s.max_tokens = 64;
  s.temperature = 0.7;
  s.top_k = 40;
  s.top_p = 0.9;
  s.seed = 42;
  s.stop = {"\n", "END"};
  s.ignore_eos = true;
  s.priority = "interactive";
  s.deadline_ms = 500;
  s.stream = true;
  s.logprobs = 3;
  save(dir, "submit_text", encode_client(s));
  s.prompt = std::vector<std::int32_t>{1, 15043, 32000};
  save(dir, "submit_ids", encode_client(s));
  save(dir, "cancel", encode_client(Cancel{"j1", "acme", "tok"}));
  save(dir, "status", encode_client(Status{"j1", "acme", ""}));
  save(dir, "ping", encode_client(Ping{7}));
  save(dir, "accepted", encode_server(Accepted{"j1", 3}));
  Tokens t;
  t.id = "j1";
  t.index = 2;
  t.ids = {450, 278};
  t.text = " the";
  t.logprobs = {{-0.5f, {{450, -0.5f}, {9, -1.5f}}}, {-0.25f, {}}};
  save(dir, "tokens", encode_server(t));
  Done d;
  d.id = "j1";
  d.tenant = "acme";
  d.finish_reason = FinishReason::length;
  d.text = "x";
  d.ids = {5};
  d.usage = {3, 1};
  d.timings = {0.5, 1.25, 2.75};
  save(dir, "done", encode_server(d));
  save(dir, "error", encode_server(Error{"j1", "acme", sy::ErrorCode::overloaded, "full", 100u}));
  save(dir, "pong", encode_server(Pong{7}));
  save(dir, "status_reply", encode_server(StatusReply{"j1", JobState::queued, 4, 0}));
  return 0;
}
