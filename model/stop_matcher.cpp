// StopMatcher: incremental detokenization with stop strings (find_stop, held_back).
#include "model/stop_matcher.hpp"

#include <algorithm>

namespace sy {

size_t find_stop(const std::string& text, size_t from, const std::vector<std::string>& stops) {
  size_t best = std::string::npos;
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    // A match ending after `from` starts at from - (size - 1) or later.
    const size_t start = from + 1 >= s.size() ? from + 1 - s.size() : 0;
    best = std::min(best, text.find(s, start));
  }
  return best;
}

size_t held_back(const std::string& text, const std::vector<std::string>& stops, size_t max_stop) {
  if (max_stop < 2) return 0;
  for (size_t k = std::min(text.size(), max_stop - 1); k > 0; --k) {
    const std::string_view tail(text.data() + text.size() - k, k);
    for (const std::string& s : stops)
      if (s.size() > k && std::string_view(s).substr(0, k) == tail) return k;
  }
  return 0;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

bool StopMatcher::cut_from(size_t old, size_t keep) {
  const size_t cut = find_stop(text_, old, stops_);
  if (cut == std::string::npos) return false;
  // Held-back bytes make cut >= keep; the bound only guards what was streamed already.
  text_.resize(std::max(cut, keep));
  return true;
}

bool StopMatcher::push(std::string_view bytes, bool last, size_t keep) {
  const size_t old = text_.size();
  text_ += utf8_.push(bytes);
  if (last) text_ += utf8_.flush();
  return cut_from(old, keep);
}

bool StopMatcher::end(size_t keep) {
  const size_t old = text_.size();
  text_ += utf8_.flush();
  return cut_from(old, keep);
}

}  // namespace sy
