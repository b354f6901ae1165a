// The greedy continuations of reference-llamacpp.json (llama.cpp on stories260K), read once for
// every test that compares against them. Header-only so each test keeps its own link set.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace sy::test {

/// One case of the reference file: a prompt and llama.cpp's greedy continuation of it.
struct ReferenceCase {
  std::string prompt;
  int n_predict = 0;
  std::vector<int32_t> prompt_token_ids;   ///< with BOS, as llama.cpp adds it
  std::vector<std::string> prompt_pieces;  ///< the text of each prompt token, BOS as "<s>"
  std::vector<int32_t> generated_token_ids;
  std::string generated_text;         ///< excludes the prompt
  std::vector<double> top1_logprobs;  ///< log-probability of each generated token
};

namespace detail {

inline std::vector<int32_t> reference_ids(const nlohmann::json& a) {
  std::vector<int32_t> out;
  for (const auto& v : a) {
    // Token ids are integers; anything else means the file is not what the tests expect.
    if (!v.is_number_integer()) throw std::runtime_error("reference: token id is not an integer");
    out.push_back(v.get<int32_t>());
  }
  return out;
}

}  // namespace detail

/// Every case of `path`, in file order; throws std::runtime_error when it is missing or not what
/// the tests expect (nlohmann::json::exception when it is not JSON).
inline std::vector<ReferenceCase> load_reference_cases(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("reference: cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json root = nlohmann::json::parse(ss.str());
  std::vector<ReferenceCase> out;
  for (const auto& c : root.at("cases")) {
    ReferenceCase k;
    k.prompt = c.at("prompt").get<std::string>();
    const auto& n = c.at("n_predict");
    if (!n.is_number_integer()) throw std::runtime_error("reference: n_predict is not an integer");
    k.n_predict = n.get<int>();
    k.prompt_token_ids = detail::reference_ids(c.at("prompt_token_ids"));
    for (const auto& p : c.at("prompt_pieces")) k.prompt_pieces.push_back(p.get<std::string>());
    k.generated_token_ids = detail::reference_ids(c.at("generated_token_ids"));
    k.generated_text = c.at("generated_text").get<std::string>();
    for (const auto& v : c.at("top1_logprobs"))
      k.top1_logprobs.push_back(v.is_number() ? v.get<double>() : 0.0);
    out.push_back(std::move(k));
  }
  return out;
}

#ifdef SY_MODELS_DIR
/// Every case of SY_MODELS_DIR/reference-llamacpp.json, read once per test process.
inline const std::vector<ReferenceCase>& reference_cases() {
  static const std::vector<ReferenceCase> cases =
      load_reference_cases(std::string(SY_MODELS_DIR) + "/reference-llamacpp.json");
  return cases;
}

/// The cases whose continuation is `n_predict` tokens long, in file order.
inline std::vector<ReferenceCase> reference_cases(int n_predict) {
  std::vector<ReferenceCase> out;
  for (const auto& c : reference_cases())
    if (c.n_predict == n_predict) out.push_back(c);
  return out;
}

/// The first case's prompt followed by llama.cpp's continuation of it: a long text the model
/// itself would write, for tests that need more tokens than a prompt.
inline std::vector<int32_t> reference_text() {
  const ReferenceCase& c = reference_cases().front();
  std::vector<int32_t> p = c.prompt_token_ids;
  p.insert(p.end(), c.generated_token_ids.begin(), c.generated_token_ids.end());
  return p;
}

/// The case for `prompt` with `n_predict` tokens; throws std::runtime_error when there is none.
inline const ReferenceCase& reference_case(const std::string& prompt, int n_predict) {
  for (const auto& c : reference_cases())
    if (c.prompt == prompt && c.n_predict == n_predict) return c;
  throw std::runtime_error("reference: no case for '" + prompt + "' with n_predict " +
                           std::to_string(n_predict));
}
#endif

}  // namespace sy::test
