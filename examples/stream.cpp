// Example: stream a job's tokens as they are generated, optionally cancelling it midway.
//
// Run it:
//   ./build/switchyard serve &
//   ./build/example_stream             # or: ... ENDPOINT "prompt" MAX_TOKENS CANCEL_AFTER
// Break it:
//   - CANCEL_AFTER 3: the client cancels after 3 chunks; the job ends with done
//     finish_reason=cancelled and usage counting only what ran;
//   - kill the example while it streams: the server's next chunk finds the client gone and
//     cancels the job (its KV blocks go back to the pool).
#include <cstdlib>
#include <iostream>

#include "clients/cpp/client.hpp"

int main(int argc, char** argv) {
  std::string endpoint = argc > 1 ? argv[1] : "tcp://127.0.0.1:5555";
  sy::wire::Submit job;
  job.id = "stream-1";
  job.tenant = "demo";
  job.prompt = std::string(argc > 2 ? argv[2] : "Once upon a time");
  job.max_tokens = argc > 3 ? static_cast<std::uint32_t>(std::atoi(argv[3])) : 64;
  int cancel_after = argc > 4 ? std::atoi(argv[4]) : -1;
  job.stream = true;

  sy::client::Client client(endpoint);
  client.submit(job);
  int chunks = 0;
  for (;;) {
    auto m = client.next(std::chrono::seconds(10));
    if (!m) {
      std::cerr << "\nno answer within 10 s\n";
      return 1;
    }
    if (auto* t = std::get_if<sy::wire::Tokens>(&*m)) {
      std::cout << t->text << std::flush;
      if (++chunks == cancel_after) client.cancel(job.id, job.tenant);
    } else if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      std::cout << "\n";
      std::cerr << "finish=" << sy::wire::to_string(d->finish_reason)
                << " completion_tokens=" << d->usage.completion_tokens
                << " ttft_ms=" << d->timings.ttft_ms << "\n";
      return 0;
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      std::cerr << "\nerror " << sy::to_string(e->code) << ": " << e->message << "\n";
      return 1;
    }
    // `accepted` needs no action
  }
}
