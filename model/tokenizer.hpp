// Tokenizers from a GGUF vocabulary: SentencePiece-style BPE with byte fallback
// (tokenizer.ggml.model = "llama") and byte-level BPE ("gpt2"), encoding as llama.cpp does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.hpp"

namespace sy {

class Tokenizer {
 public:
  enum class Kind { Spm, Bpe };

  /// Builds from tokenizer.ggml.* metadata (works on vocab-only files); throws gguf::Error.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);
  virtual ~Tokenizer() = default;

  /// Encodes text; with add_special, BOS (and EOS) are added as the vocabulary's
  /// add_bos_token / add_eos_token (llama.cpp defaults: BOS yes for SPM, no for gpt2).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special) const = 0;
  /// The bytes of one token as they appear in text (SPM "▁" becomes a space, byte tokens their
  /// byte, control tokens nothing).
  virtual std::string token_to_piece(int32_t id) const = 0;
  /// Decodes ids to text; drops the SPM leading space of the first token as llama.cpp does
  /// when `strip_leading_space` is true.
  std::string decode(const std::vector<int32_t>& ids, bool strip_leading_space = false) const;

  Kind kind() const { return kind_; }
  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  /// True for tokens that end generation (EOS, EOT).
  bool is_eog(int32_t id) const;
  const std::string& token_text(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }

 protected:
  Kind kind_ = Kind::Spm;
  std::vector<std::string> tokens_;
  int32_t bos_ = -1;
  int32_t eos_ = -1;
  int32_t eot_ = -1;
};

/// Cuts a byte stream into complete UTF-8 text for streaming: bytes of a character split across
/// tokens are held back until the character is complete.
class Utf8Stream {
 public:
  /// Appends bytes; returns the complete-character prefix of everything pending.
  std::string push(std::string_view bytes);
  /// Whatever is left (incomplete sequences are returned as they are).
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace sy
