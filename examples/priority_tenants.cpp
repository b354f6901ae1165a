// Example: mixed priorities. A backlog of batch-class jobs is queued first, then one interactive
// job; the interactive one overtakes the waiting batch work.
//
// Run it:
//   ./build/switchyard serve &                  # default classes: interactive (rank 0), batch
//   ./build/example_priority_tenants            # or: ... ENDPOINT N_BATCH_JOBS
// Break it:
//   - send the "interactive" job with priority "batch" (edit kUrgentClass): it now finishes
//     behind the backlog, in arrival order;
//   - a class name the server does not know: the job gets error bad_request naming the class;
//   - N_BATCH_JOBS above the batch queue limit: the excess gets `overloaded` with retry_after_ms.
#include <cstdlib>
#include <iostream>
#include <map>

#include "clients/cpp/client.hpp"

namespace {
const char* kUrgentClass = "interactive";
}

int main(int argc, char** argv) {
  std::string endpoint = argc > 1 ? argv[1] : "tcp://127.0.0.1:5555";
  int n_batch = argc > 2 ? std::atoi(argv[2]) : 32;
  sy::client::Client client(endpoint);

  auto make = [](const std::string& id, const std::string& tenant, const std::string& cls) {
    sy::wire::Submit s;
    s.id = id;
    s.tenant = tenant;
    s.prompt = std::string("Once upon a time");
    s.max_tokens = 32;
    s.ignore_eos = true;
    s.priority = cls;
    return s;
  };
  for (int i = 0; i < n_batch; ++i)
    client.submit(make("batch-" + std::to_string(i), "nightly", "batch"));
  client.submit(make("urgent", "frontend", kUrgentClass));

  // Print the order in which jobs finish; the urgent one should come early.
  int finished = 0, total = n_batch + 1;
  while (finished < total) {
    auto m = client.next(std::chrono::seconds(30));
    if (!m) {
      std::cerr << "no answer within 30 s\n";
      return 1;
    }
    if (auto* d = std::get_if<sy::wire::Done>(&*m)) {
      ++finished;
      std::cout << finished << ". " << d->id << " (queue " << d->timings.queue_ms << " ms)\n";
    } else if (auto* e = std::get_if<sy::wire::Error>(&*m)) {
      ++finished;
      std::cout << finished << ". " << e->id << " error " << sy::to_string(e->code) << ": "
                << e->message << "\n";
    }
  }
  return 0;
}
