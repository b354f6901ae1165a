// Registration of the actor message types and of the ErrorCode error category with CAF, and the
// shared time base (log_line is in actors/log.cpp).
#include "actors/messages.hpp"

#include <chrono>

namespace sy {

caf::error make_error(ErrorCode code) {
  return caf::error(static_cast<uint8_t>(static_cast<uint8_t>(code) + 1), kErrorCategory);
}

caf::error make_error(ErrorCode code, std::string context) {
  if (context.empty()) return make_error(code);
  return caf::error(static_cast<uint8_t>(static_cast<uint8_t>(code) + 1), kErrorCategory,
                    caf::make_message(std::move(context)));
}

std::optional<ErrorCode> error_code_of(const caf::error& err) {
  if (!err || err.category() != kErrorCategory) return std::nullopt;
  const unsigned v = err.code() - 1u;
  if (v >= detail::error_code_names.size()) return std::nullopt;
  return static_cast<ErrorCode>(v);
}

std::string render_error_code(uint8_t code, caf::atom_value, const caf::message& context) {
  const unsigned v = code - 1u;
  std::string out;
  if (v < detail::error_code_names.size()) {
    out = to_string(static_cast<ErrorCode>(v));
  } else {
    out = "unknown error code ";
    out += std::to_string(code);
  }
  if (context.match_elements<std::string>()) {
    out += " (";
    out += context.get_as<std::string>(0);
    out += ")";
  } else if (!context.empty()) {
    out += " " + caf::to_string(context);
  }
  return out;
}

void register_message_types(caf::actor_system_config& cfg) {
  cfg.add_error_category(kErrorCategory, render_error_code);
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
  cfg.add_message_type<StepEvent>("StepEvent");
  cfg.add_message_type<ToolCallEvent>("ToolCallEvent");
  cfg.add_message_type<ProgramStep>("ProgramStep");
  cfg.add_message_type<ToolResultRequest>("ToolResultRequest");
  cfg.add_message_type<EnqueueReply>("EnqueueReply");
  cfg.add_message_type<JobStatus>("JobStatus");
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

}  // namespace sy
