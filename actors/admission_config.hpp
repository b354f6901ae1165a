// Configuration of admission: tenants, quotas, the result cache, prompt and output caps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/intake_meter.hpp"
#include "core/trace.hpp"

namespace sy {

struct ConstraintSupport;

/// One configured tenant (config `tenants`): its token, fair-share weight and quotas.
struct TenantConfig {
  std::string name;
  std::string token;             // "" = no token needed
  double weight = 1.0;           // share inside a priority class
  uint32_t max_in_flight = 0;    // 0 = unlimited
  double tokens_per_second = 0;  // token-rate quota (prompt + max_tokens); 0 = unlimited
  double burst_tokens = 0;       // bucket size; 0 = tokens_per_second * 10
};

/// Admission (config `tenants`, `admission`, `admin_token`).
struct AdmissionConfig {
  bool allow_anonymous = true;  // no tenants configured: every tenant name is accepted
  std::vector<TenantConfig> tenants;
  uint32_t max_prompt_tokens = 0;  // 0 = the model context
  uint32_t max_output_tokens = 4096;
  /// Programs running at once (docs/programs.md): each holds its walk and its context here, so
  /// the count is bounded; a program beyond it is refused (bad_request, retry later).
  std::size_t max_programs = 4096;
  size_t result_cache = 100000;  // finished job keys remembered for resubmission
  // ...and their bytes at most (completion text and ids, logprobs, keys): a count alone lets
  // long completions take gigabytes (100,000 of 4,096 tokens are ~1.9 GB). Oldest go first.
  size_t result_cache_bytes = size_t{256} << 20;
  // Open-tenant mode: a tenant name that is not configured is forgotten once it has no job in
  // flight and has not been used for this long (its state is an unlimited quota of weight 1,
  // rebuilt as it was on its next submit), so that endless new names do not grow the tables.
  int64_t tenant_idle_ms = 60000;
  // ...and at most this many such idle tenants are kept whatever their age (the longest idle
  // go first): the bound when names arrive faster than tenant_idle_ms forgets them.
  size_t max_idle_tenants = 10000;
  std::string admin_token;  // operator commands (switchyard ctl); "" = none allowed
  // Let prompt + max_tokens exceed the model context (set when the KV policy is sinks, whose
  // positions never pass the cache size); jobs under other policies still end at the context.
  bool beyond_context = false;
  // The chat template text that renders `messages` submits, overriding the model file's
  // tokenizer.chat_template; "" = the file's. Filled from ServerConfig::chat_template by
  // `switchyard serve` (model/chat_template.hpp load_template_text).
  std::string chat_template;
  std::string chat_template_source;  // where it came from (a name or a file), for the log
  // Wiring, not configuration: the gateway's meter of admission's mailbox
  // (core/intake_meter.hpp), counted out here; nullptr where no gateway feeds this admission
  // (tests).
  std::shared_ptr<IntakeMeter> intake;
  // Wiring: the vocabulary index and compiled constraints shared with the executors
  // (actors/constraint_support.hpp); nullptr: admission makes its own at the first constraint.
  std::shared_ptr<ConstraintSupport> constraints;
  // Wiring: where traced jobs' admission and journal spans go (core/trace.hpp,
  // docs/tracing.md); nullptr: tracing is off and no job is traced.
  std::shared_ptr<TraceBuffer> traces;
  // TESTS ONLY (`serve --test-admission-stall-ms`): admission sleeps this long before each
  // submit it takes from its mailbox, so that a test can fill the intake bound at will.
  int test_stall_ms = 0;
};

}  // namespace sy
