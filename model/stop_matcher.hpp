// Stop strings over incrementally detokenized text: one matcher for the batcher and the batch
// generator, so that both cut a completion at the same byte and hold back the same tail.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.hpp"

namespace sy {

/// Earliest start of a stop string in `text` that ends after byte `from` (matches that end at or
/// before it were searched when that text arrived), or npos. Empty stop strings are ignored: one
/// would end every job at once.
size_t find_stop(const std::string& text, size_t from, const std::vector<std::string>& stops);

/// Length of the longest suffix of `text` that is a proper prefix of some stop string (at most
/// `max_stop` - 1, `max_stop` being the longest stop string): a later token could complete the
/// match, so these bytes must not be streamed yet.
size_t held_back(const std::string& text, const std::vector<std::string>& stops, size_t max_stop);

/// A completion's text as its tokens arrive: bytes of a character split across tokens wait for
/// the rest (Utf8Stream), and the text is cut where a stop string starts.
class StopMatcher {
 public:
  StopMatcher() = default;
  explicit StopMatcher(std::vector<std::string> stops);

  /// Appends one token's bytes; with `last` (no token follows) incomplete characters are flushed
  /// as they are. True when a stop string matched: text() is then cut at its start, but never
  /// below `keep` bytes (what the caller already streamed).
  bool push(std::string_view bytes, bool last, size_t keep);
  /// The end of generation (an end-of-generation token, which has no text): flushes what is
  /// pending and cuts at a stop string that the flushed bytes complete, never below `keep`.
  /// True when one matched.
  bool end(size_t keep);

  /// The complete characters so far, cut at a stop string once one matched.
  const std::string& text() const { return text_; }
  /// Bytes of text() that no later token can turn into part of a stop match (safe to stream).
  size_t stable() const { return text_.size() - held_back(text_, stops_, max_stop_); }
  const std::vector<std::string>& stops() const { return stops_; }

 private:
  bool cut_from(size_t old, size_t keep);

  std::vector<std::string> stops_;
  size_t max_stop_ = 0;  // longest stop string
  Utf8Stream utf8_;
  std::string text_;
};

}  // namespace sy
