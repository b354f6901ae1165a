// Tokenizers from a GGUF vocabulary: SentencePiece-style BPE with byte fallback
// (tokenizer.ggml.model = "llama") and byte-level BPE ("gpt2", with the pre-split rules of
// GPT-2, Llama 3, Qwen2, DeepSeek, Falcon, StarCoder and llama.cpp's default), encoding and
// decoding as llama.cpp does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/gguf.hpp"

namespace sy {

/// Hash for string maps that are searched with string_view keys (no temporary strings).
struct StringViewHash {
  using is_transparent = void;
  /// Hashes the characters, the same for std::string and std::string_view keys.
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

class Tokenizer {
 public:
  enum class Kind { Spm, Bpe };

  /// How byte-level BPE cuts text into words before merging (tokenizer.ggml.pre); SPM has None.
  /// Each value is one sequence of regexes as llama.cpp applies them; several names can share
  /// one (for example "mpt" uses Gpt2, "refact" uses Starcoder).
  enum class PreSplit {
    None,           // SentencePiece: no pre-split
    Gpt2,           // "gpt-2", "mpt", "olmo", ...
    Llama3,         // "llama-bpe", "llama3" and the other names llama.cpp maps to Llama-3 rules
    Default,        // "default" or no tokenizer.ggml.pre: llama.cpp's fallback regex sequence
    Qwen2,          // "qwen2", "stablelm2", ...: Llama 3's rule with single digits
    DeepseekLlm,    // "deepseek-llm"
    DeepseekCoder,  // "deepseek-coder"
    Falcon,         // "falcon"
    Starcoder,      // "starcoder", "refact", "command-r", ...: digits alone, then GPT-2
  };

  /// GGUF token types (tokenizer.ggml.token_type), numbered as llama.cpp's llama_token_type.
  enum class TokenType : uint8_t {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
  };

  /// Builds from tokenizer.ggml.* metadata (works on vocab-only files); throws gguf::Error.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);
  virtual ~Tokenizer() = default;

  /// Encodes text; with add_special, BOS (and EOS) are added as the vocabulary's
  /// add_bos_token / add_eos_token (llama.cpp defaults: BOS yes for SPM, no for gpt2).
  /// User-defined tokens in the text are always matched whole; control tokens ("<s>",
  /// "<|endoftext|>") only with parse_special, otherwise they are tokenized as plain text.
  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              bool parse_special = false) const;
  /// The bytes of one token as they appear in text (SPM "▁" becomes a space, byte tokens their
  /// byte, control and unknown tokens nothing unless `special`, then their text).
  std::string token_to_piece(int32_t id, bool special = false) const;
  /// Decodes ids to text; drops the SPM leading space of the first token as llama.cpp does
  /// when `strip_leading_space` is true.
  std::string decode(const std::vector<int32_t>& ids, bool strip_leading_space = false) const;
  /// Decodes ids as llama.cpp's llama_detokenize: with remove_special a leading BOS (trailing EOS)
  /// is dropped when the vocabulary adds it; control tokens print only with unparse_special; the
  /// SPM dummy-prefix space is removed; then, where clean_spaces() holds, the spaces it puts
  /// before " ?!.," and some apostrophe contractions are taken out again.
  std::string detokenize(const std::vector<int32_t>& ids, bool remove_special = false,
                         bool unparse_special = false) const;

  /// SentencePiece-style or byte-level BPE.
  Kind kind() const { return kind_; }
  /// The byte-level BPE pre-split rules (None for SPM).
  PreSplit pre_split() const { return pre_; }
  /// True when tokenizer.ggml.pre was absent and llama.cpp's "default" rules were assumed
  /// (llama.cpp warns that generation quality may suffer); callers may want to say so.
  bool pre_assumed() const { return pre_assumed_; }
  /// Whether detokenize() removes the spaces before punctuation and contractions (BPE).
  bool clean_spaces() const { return clean_spaces_; }
  /// Number of tokens in the vocabulary.
  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  /// Beginning- and end-of-sequence ids (-1 when the vocabulary has none).
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  /// The end-of-turn token, -1 when the vocabulary has none.
  int32_t eot() const { return eot_; }
  /// Whether encode(…, add_special = true) prepends BOS / appends EOS.
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  /// True for tokens that end generation (EOS, EOT, EOM, and the end tokens llama.cpp
  /// recognizes by their text, such as "<|endoftext|>" and "<|im_end|>").
  bool is_eog(int32_t id) const;
  /// All end-of-generation ids (those is_eog() accepts), ascending, without duplicates.
  const std::vector<int32_t>& eog_ids() const { return eog_; }
  /// The tokenizer.ggml.pre names of byte-level BPE vocabularies this build tokenizes,
  /// comma-separated (for error messages and docs).
  static std::string supported_pre_tokenizers();
  /// A token's text as stored in the vocabulary (SPM "▁", GPT-2 byte characters); throws on a bad
  /// id.
  const std::string& token_text(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }
  /// A token's type (after llama.cpp's promotion of end tokens to Control); throws on a bad id.
  TokenType token_type(int32_t id) const { return types_.at(static_cast<size_t>(id)); }
  /// The id of a token's exact text, -1 when it is not in the vocabulary.
  int32_t find_token(std::string_view text) const;

 protected:
  /// Appends the ids of one run of plain text (no special tokens inside). `after_special` is
  /// true at the start of the text and right after a special token (SPM adds its dummy prefix
  /// space there).
  virtual void encode_text(std::string_view text, bool after_special,
                           std::vector<int32_t>& out) const = 0;
  /// Piece of a normal token (SPM: "▁" to space; byte-level BPE: the byte mapping reversed).
  virtual std::string normal_piece(const std::string& text) const = 0;

  Kind kind_ = Kind::Spm;
  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string, int32_t, StringViewHash, std::equal_to<>> text_to_id_;
  int32_t bos_ = -1;
  int32_t eos_ = -1;
  int32_t eot_ = -1;
  int32_t eom_ = -1;
  int32_t unk_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  bool clean_spaces_ = false;
  bool ignore_merges_ = false;  // a pre-split word that is itself a token is taken whole (Llama 3)
  bool pre_assumed_ = false;
  PreSplit pre_ = PreSplit::None;
  std::vector<int32_t> eog_;      // sorted
  std::vector<int32_t> special_;  // control/user-defined/unknown ids, longest text first
};

namespace tokenizer_detail {
/// The words `rules` cut `text` into before byte-level BPE merging, as UTF-8 (invalid bytes
/// become U+FFFD first, as in encoding); exposed for tests. None returns the text whole.
std::vector<std::string> pre_split(Tokenizer::PreSplit rules, std::string_view text);
}  // namespace tokenizer_detail

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
