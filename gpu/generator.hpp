// A batch generation driver over the Engine interface: runs a fixed set of requests together to
// completion (chunked prefill and decode mixed in each step). Used by `switchyard generate`, the
// tests and the benchmark; the serving batcher does its own scheduling.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "constraints/matcher.hpp"
#include "gpu/engine.hpp"
#include "model/sampler.hpp"

namespace sy {

/// One generation job: prompt token ids (BOS included if wanted) and how to continue them.
struct GenRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 16;            // >= 1; prompt + max_tokens must fit the model context
  std::vector<std::string> stop;  // stop strings: the text ends before the first one found
  bool ignore_eos = false;        // keep going past end-of-generation tokens
  // The output's constraint, compiled against this engine's vocabulary (constraints/filter.hpp
  // vocabulary_of); null: free text. End of generation comes only where it accepts the text.
  std::shared_ptr<const constraints::Compiled> constraint;
};

/// What a request produced. An end-of-generation token that stops a request is not part of
/// `tokens` or `text`; the token that completes a stop string is in `tokens` but the text is cut
/// before the stop string.
struct GenResult {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<std::vector<TokenLogprob>> logprobs;  // per token: top n_logprobs (empty if 0)
  std::vector<float> token_logprob;                 // per token: the chosen token's logprob
  std::string finish_reason;                        // "stop" | "length"
  int prompt_tokens = 0;
};

struct GenOptions {
  int prefill_chunk = 512;  // prompt tokens per sequence per step; bounds one step's activations
};

/// Called as text becomes final: once per token appended to a result (the delta may be empty
/// while bytes of a character or a possible stop string are held back), plus once with token -1
/// when a request ends on end-of-generation with held-back text still to release.
/// The deltas of one request concatenate to its final text.
using TokenCallback =
    std::function<void(size_t req_index, int32_t token, std::string_view text_delta)>;

/// Runs all requests together until each stops. KV blocks come from engine.pool() as sequences
/// grow and go back when each finishes (also on error). Throws std::invalid_argument for a bad
/// request (empty prompt, token id out of range, prompt + max_tokens over the context, bad
/// sampling parameters) and std::runtime_error("out of KV blocks ...") when the pool cannot hold
/// the batch at its longest.
std::vector<GenResult> generate(Engine& engine, const std::vector<GenRequest>& reqs,
                                const GenOptions& opt = {}, const TokenCallback& on_token = {});

}  // namespace sy
