// Example: submit one job to a running server and wait for its result (C++ client library).
//
// Run it:
//   ./build/switchyard serve &                         # listens on tcp://127.0.0.1:5555
//   ./build/example_submit_and_wait                    # or: ... ENDPOINT "prompt text" MAX_TOKENS
// Break it:
//   - no server running: the example says nobody answered within 10 s and exits 1;
//   - MAX_TOKENS 0 (or 100000): the server answers `error bad_request` naming max_tokens;
//   - a prompt longer than the model context: `bad_request prompt has N tokens, limit M`.
#include <cstdlib>
#include <iostream>

#include "clients/cpp/client.hpp"

int main(int argc, char** argv) {
  std::string endpoint = argc > 1 ? argv[1] : "tcp://127.0.0.1:5555";
  sy::wire::Submit job;
  job.id = "example-1";
  job.tenant = "demo";
  job.prompt = std::string(argc > 2 ? argv[2] : "Once upon a time");
  job.max_tokens = argc > 3 ? static_cast<std::uint32_t>(std::atoi(argv[3])) : 32;
  job.temperature = 0;  // greedy: the same answer every run

  sy::client::Client client(endpoint);
  auto r = client.run(job, std::chrono::seconds(10));
  if (r.timed_out) {
    std::cerr << "no answer from " << endpoint << " within 10 s (is the server running?)\n";
    return 1;
  }
  if (r.error) {
    std::cerr << "error " << sy::to_string(r.error->code) << ": " << r.error->message << "\n";
    return 1;
  }
  std::cout << r.text << "\n";
  std::cerr << "finish=" << sy::wire::to_string(r.done->finish_reason)
            << " prompt_tokens=" << r.done->usage.prompt_tokens
            << " completion_tokens=" << r.done->usage.completion_tokens
            << " ttft_ms=" << r.done->timings.ttft_ms << " total_ms=" << r.done->timings.total_ms
            << "\n";
  return 0;
}
