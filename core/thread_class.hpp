// The classes of the server's threads: a name `top -H` shows, and for the threads that only compute
// (the executors) a CPU policy that yields every core to the threads on a request's path.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sy {

/// How a thread of the server competes for a core (config `executors.cpu_priority`,
/// docs/architecture.md).
enum class CpuPriority {
  normal,      ///< the kernel's default policy
  background,  ///< Linux SCHED_IDLE: on a core only while no normal thread of its group wants it
};

/// "normal" or "background"; nullopt for anything else.
std::optional<CpuPriority> parse_cpu_priority(std::string_view s);
const char* to_string(CpuPriority p);

/// Names the calling thread (`top -H`, perf and /proc show it; cut to 15 bytes) and moves it to
/// `p`. Returns "" or why the kernel refused the policy (the thread then keeps its own).
std::string enter_thread_class(const std::string& name, CpuPriority p);

}  // namespace sy
