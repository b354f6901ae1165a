#include "core/thread_class.hpp"

#include <pthread.h>
#include <sched.h>

#include <cerrno>
#include <cstring>

namespace sy {

std::optional<CpuPriority> parse_cpu_priority(std::string_view s) {
  if (s == "normal") return CpuPriority::normal;
  if (s == "background") return CpuPriority::background;
  return std::nullopt;
}

const char* to_string(CpuPriority p) {
  return p == CpuPriority::background ? "background" : "normal";
}

std::string enter_thread_class(const std::string& name, CpuPriority p) {
  // The kernel keeps 15 bytes of a thread's name and refuses a longer one.
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  if (p == CpuPriority::normal) return "";
#ifdef SCHED_IDLE
  sched_param param{};
  param.sched_priority = 0;
  if (sched_setscheduler(0, SCHED_IDLE, &param) != 0) return std::strerror(errno);
  return "";
#else
  return "this system has no SCHED_IDLE";
#endif
}

}  // namespace sy
