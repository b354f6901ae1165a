// Chat templates: renders a list of chat messages into prompt text with the Jinja subset that
// GGUF `tokenizer.chat_template` texts use, and tokenizes the result so that only the
// template's own text can become control tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sy {

class Tokenizer;

namespace chat {

/// One chat message as a client sends it.
struct Message {
  std::string role;
  std::string content;
};

/// A template that cannot be parsed or rendered; the message names the problem (and the line).
class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The template called raise_exception(text): the template refuses these messages (roles out of
/// order, an unsupported role...). what() is the template's own text.
class TemplateRaised : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

/// What the renderer is given besides the messages.
struct RenderOptions {
  std::string bos_token;              ///< text of the vocabulary's BOS token ("" when none)
  std::string eos_token;              ///< text of the vocabulary's EOS token ("" when none)
  bool add_generation_prompt = true;  ///< end with the header of the assistant's turn
};

/// Rendered prompt text. `from_messages[i]` is 1 where byte i of `text` came from message data
/// (a role or a content) and 0 where it came from the template itself (its literals, bos_token).
struct Rendered {
  std::string text;
  std::vector<uint8_t> from_messages;
};

/// A parsed template. The supported language is Jinja2 as Hugging Face renders chat templates
/// (trim_blocks and lstrip_blocks on, loop controls on, no autoescape):
///   tags      {{ }}, {% %}, {# #}, with - and + whitespace control;
///   statements  for (with `else`, an `if` filter, tuple targets, loop.index/index0/revindex/
///             revindex0/first/last/length/previtem/nextitem, break, continue), if/elif/else,
///             set (also `set ns.attr`, and `{% set x %}...{% endset %}`), raw, and
///             Hugging Face's `generation` block (its body is rendered);
///   expressions literals (str, int, float, true/false/none, lists, dicts), variables, `.attr`,
///             `[key]`, slices, `~ + - * / // % **`, comparisons, `in`, `not in`, `and or not`,
///             `x if c else y`, filters (trim, length/count, upper, lower, capitalize, title,
///             default/d, first, last, join, string, int, float, list, replace, tojson (as
///             Hugging Face's: no HTML escaping, keys in order), safe, e/escape, items, reverse,
///             abs, round, select/reject and selectattr/rejectattr with a test, map (a filter
///             name or attribute=), unique, sort, dictsort, indent, wordcount, sum, min, max,
///             attr),
///             tests (defined, undefined, none, string, number, integer, float, boolean,
///             mapping, iterable, sequence, true, false, even, odd, divisibleby, eq/equalto/==,
///             in, lower, upper), str methods (strip, lstrip, rstrip, startswith, endswith,
///             split, upper, lower, title, capitalize, replace), dict methods (items, keys,
///             values, get), and the globals range, namespace, dict, raise_exception. Case
///             filters and methods change ASCII letters only. Undefined values are lenient:
///             an attribute or item of one is undefined again (Jinja raises there).
/// Anything else (macros, includes, unknown filters) is a TemplateError at parse time where the
/// parser can tell, else when rendering reaches it.
class ChatTemplate {
 public:
  /// Parses; throws TemplateError naming the line and the problem.
  explicit ChatTemplate(std::string_view source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  /// Renders `messages`; throws TemplateRaised for the template's raise_exception and
  /// TemplateError for anything the renderer cannot do (or output past kMaxOutputBytes).
  Rendered render(const std::vector<Message>& messages, const RenderOptions& opts) const;

  /// The output limit of one render: 16 MiB, far above any prompt the context admits, so only
  /// a runaway template (a loop over range(10**9)) meets it.
  static constexpr std::size_t kMaxOutputBytes = std::size_t{16} << 20;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The template texts built in by name: "chatml" (Qwen), "llama3", "gemma", "mistral", "phi3";
/// nullopt for another name.
std::optional<std::string> builtin_template(std::string_view name);
/// The built-in names, for help texts and error messages.
std::vector<std::string> builtin_template_names();

/// The template a `--chat-template NAME|FILE` value stands for: a built-in name, else the text of
/// the file. Throws std::runtime_error naming the file when it cannot be read.
std::string load_template_text(const std::string& name_or_file);

/// Tokenizes rendered prompts for one vocabulary. Control tokens (and user-defined and unknown
/// ones: those parse_special matches) written by the template become their ids, longest text
/// first as llama.cpp's special-token pass does; the same text inside message data stays plain
/// text (user-defined tokens, which the tokenizer always matches whole, excepted). The text
/// between them is encoded as the tokenizer encodes text between special tokens. BOS is
/// prepended when the vocabulary adds it to text prompts and the rendered text does not already
/// start with it; EOS never is.
class PromptTokenizer {
 public:
  /// Collects the vocabulary's special tokens once; `tok` must outlive this object.
  explicit PromptTokenizer(const Tokenizer& tok);
  std::vector<int32_t> operator()(const Rendered& r) const;

 private:
  const Tokenizer* tok_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // longest text first
};

/// PromptTokenizer(tok)(r), for one-off use.
std::vector<int32_t> tokenize_rendered(const Tokenizer& tok, const Rendered& r);

}  // namespace chat
}  // namespace sy
