// Registration of the actor message types with CAF, and the shared time base.
#include "actors/messages.hpp"

#include <chrono>
#include <cstdio>

namespace sy {

void register_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<ClientRef>("ClientRef");
  cfg.add_message_type<Job>("Job");
  cfg.add_message_type<SubmitRequest>("SubmitRequest");
  cfg.add_message_type<KeyRequest>("KeyRequest");
  cfg.add_message_type<SeqPlan>("SeqPlan");
  cfg.add_message_type<StepPlan>("StepPlan");
  cfg.add_message_type<SeqResult>("SeqResult");
  cfg.add_message_type<StepResult>("StepResult");
  cfg.add_message_type<AcceptedEvent>("AcceptedEvent");
  cfg.add_message_type<TokensEvent>("TokensEvent");
  cfg.add_message_type<DoneEvent>("DoneEvent");
  cfg.add_message_type<ErrorEvent>("ErrorEvent");
  cfg.add_message_type<StatusEvent>("StatusEvent");
  cfg.add_message_type<JobOutcome>("JobOutcome");
  cfg.add_message_type<std::vector<uint64_t>>("std::vector<uint64_t>");
  cfg.add_message_type<TenantWeights>("TenantWeights");
  cfg.add_message_type<policy::KvPolicy>("KvPolicy");
  cfg.add_message_type<ControlRequest>("ControlRequest");
  cfg.add_message_type<ControlEvent>("ControlEvent");
  cfg.add_message_type<PairFailure>("PairFailure");
  cfg.add_message_type<std::vector<Job>>("std::vector<Job>");
  cfg.add_message_type<std::vector<caf::actor>>("std::vector<caf::actor>");
  cfg.add_message_type<AdmissionStats>("AdmissionStats");
  cfg.add_message_type<RouterStats>("RouterStats");
  cfg.add_message_type<BatcherStats>("BatcherStats");
  cfg.add_message_type<SupervisorStats>("SupervisorStats");
  cfg.add_message_type<JournalStats>("JournalStats");
  cfg.add_message_type<ExecutorStats>("ExecutorStats");
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void log_line(const std::string& text) {
  const std::string line = "switchyard: " + text + "\n";
  // One fwrite on unbuffered stderr is one write(2): whole lines, never interleaved.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace sy
