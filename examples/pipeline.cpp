// Example: a pipeline. A producer PUSHes jobs into the server's PULL input as fast as it can; a
// sink PULLs the results (done or error) from the server's PUSH output.
//
// Run it:
//   ./build/switchyard serve --pull tcp://127.0.0.1:5556 --results tcp://127.0.0.1:5557 &
//   ./build/example_pipeline                        # or: ... PULL_ADDR RESULTS_ADDR N_JOBS
// Break it:
//   - N_JOBS far above the server's queue limits: nothing is refused; the producer just blocks
//     while the queues are full (ZeroMQ high-water mark), then goes on;
//   - a server started without --pull: the producer cannot hand over a job within 10 s and says
//     so; without --results: the sink waits in vain and says so.
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "clients/cpp/client.hpp"

int main(int argc, char** argv) {
  std::string pull = argc > 1 ? argv[1] : "tcp://127.0.0.1:5556";
  std::string results = argc > 2 ? argv[2] : "tcp://127.0.0.1:5557";
  int n = argc > 3 ? std::atoi(argv[3]) : 100;
  const auto patience = std::chrono::seconds(10);

  sy::client::Sink sink(results);  // connect first: results are never lost, but this is tidier
  std::atomic<bool> producer_ok{true};
  std::thread producer([&] {
    sy::client::Pusher pusher(pull);
    for (int i = 0; i < n; ++i) {
      sy::wire::Submit job;
      job.id = "pipe-" + std::to_string(i);
      job.tenant = "demo";
      job.prompt = std::string("Once upon a time");
      job.max_tokens = 8;
      if (!pusher.submit(job, patience)) {
        std::cerr << "producer: the server did not take job " << i << " within 10 s\n";
        producer_ok = false;
        return;
      }
    }
  });

  int done = 0, failed = 0;
  while (done + failed < n) {
    auto m = sink.next(patience);
    if (!m) {
      std::cerr << "sink: no result within 10 s (" << done + failed << "/" << n << ")\n";
      break;
    }
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      ++done;
      if (done <= 3) std::cout << d->id << ": " << d->text << "\n";
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      ++failed;
      std::cerr << e->id << ": error " << sy::to_string(e->code) << ": " << e->message << "\n";
    }
  }
  producer.join();
  std::cerr << "done " << done << ", errors " << failed << ", of " << n << "\n";
  return producer_ok && done == n ? 0 : 1;
}
