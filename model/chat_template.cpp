// Chat templates: the public API of chat_template.hpp. The Jinja2-subset interpreter is in the
// chat_template_*.cpp files (values, lexer, parser, eval, builtins); it marks every output byte as
// coming from the template or from message data, so that control tokens are parsed only in the
// template's own text.
#include "model/chat_template.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "model/chat_template_internal.hpp"
#include "model/tokenizer.hpp"

namespace sy::chat {

struct ChatTemplate::Impl {
  detail::Body body;
};

ChatTemplate::ChatTemplate(std::string_view source) : impl_(std::make_unique<Impl>()) {
  impl_->body = detail::parse_template(source);
}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

Rendered ChatTemplate::render(const std::vector<Message>& messages,
                              const RenderOptions& opts) const {
  using namespace detail;
  Ctx c;
  c.frames.emplace_back();
  auto& g = c.frames.back();
  List msgs;
  for (const Message& m : messages) {
    Dict d;
    d.set("role", Value::string(Str::marked(m.role, true)));
    d.set("content", Value::string(Str::marked(m.content, true)));
    msgs.push_back(of_dict(std::move(d)));
  }
  g["messages"] = Value::of_list(std::move(msgs));
  g["bos_token"] = Value::text(opts.bos_token);
  g["eos_token"] = Value::text(opts.eos_token);
  g["add_generation_prompt"] = Value::boolean(opts.add_generation_prompt);
  g["raise_exception"] = Value::func("raise_exception");
  g["range"] = Value::func("range");
  g["namespace"] = Value::func("namespace");
  g["dict"] = Value::func("dict");
  c.frames.emplace_back();  // the template's own top-level variables
  exec(impl_->body, c);
  return Rendered{std::move(c.out.s), std::move(c.out.t)};
}

// ---- built-in templates ----------------------------------------------------------------------

namespace {
// The chat templates these model families publish in their tokenizer configs.
const std::pair<const char*, const char*> kBuiltins[] = {
    {"chatml",
     "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
     "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
     "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"},
    {"llama3",
     "{% set loop_messages = messages %}{% for message in loop_messages %}"
     "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
     "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
     "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
     "{% endif %}"},
    {"gemma",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
     "{{ raise_exception('System role not supported') }}{% endif %}"
     "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
     "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
     "{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
     "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
     "{{'<start_of_turn>model\n'}}{% endif %}"},
    {"mistral",
     "{{ bos_token }}{% for message in messages %}"
     "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
     "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' "
     "}}"
     "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
     "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor "
     "%}"},
    {"phi3",
     "{% for message in messages %}{% if message['role'] == 'system' %}"
     "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
     "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
     "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"},
};
}  // namespace

std::optional<std::string> builtin_template(std::string_view name) {
  for (const auto& [n, t] : kBuiltins)
    if (name == n) return std::string(t);
  return std::nullopt;
}

std::vector<std::string> builtin_template_names() {
  std::vector<std::string> out;
  for (const auto& b : kBuiltins) out.emplace_back(b.first);
  return out;
}

std::string load_template_text(const std::string& name_or_file) {
  if (auto t = builtin_template(name_or_file)) return *t;
  std::ifstream in(name_or_file, std::ios::binary);
  if (!in) {
    std::string names;
    for (const auto& n : builtin_template_names()) names += (names.empty() ? "" : ", ") + n;
    throw std::runtime_error("chat template '" + name_or_file + "' is neither a built-in name (" +
                             names + ") nor a readable file");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- tokenizing a rendered prompt ------------------------------------------------------------

PromptTokenizer::PromptTokenizer(const Tokenizer& tok) : tok_(&tok) {
  // The tokens that parse_special would match (control, user-defined, unknown), longest first,
  // as llama.cpp's special-token pass orders them.
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    const auto t = tok.token_type(id);
    if (t != Tokenizer::TokenType::Control && t != Tokenizer::TokenType::UserDefined &&
        t != Tokenizer::TokenType::Unknown)
      continue;
    const std::string& text = tok.token_text(id);
    if (!text.empty()) specials_.emplace_back(text, id);
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::vector<int32_t> tokenize_rendered(const Tokenizer& tok, const Rendered& r) {
  return PromptTokenizer(tok)(r);
}

std::vector<int32_t> PromptTokenizer::operator()(const Rendered& r) const {
  const Tokenizer& tok = *tok_;

  struct Frag {
    int32_t id;  // -1: text [off, off + len)
    std::size_t off, len;
  };
  std::vector<Frag> frags{{-1, 0, r.text.size()}};
  const auto clean = [&](std::size_t off, std::size_t len) {
    for (std::size_t i = off; i < off + len; ++i)
      if (i < r.from_messages.size() && r.from_messages[i]) return false;
    return true;
  };
  for (const auto& [text, id] : specials_) {
    std::vector<Frag> next;
    next.reserve(frags.size());
    for (const Frag& f : frags) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      std::size_t pos = f.off;
      const std::size_t end = f.off + f.len;
      std::size_t start = f.off;
      while (pos < end) {
        const std::size_t at = r.text.find(text, pos);
        if (at == std::string::npos || at + text.size() > end) break;
        if (!clean(at, text.size())) {
          pos = at + 1;
          continue;
        }
        if (at > start) next.push_back({-1, start, at - start});
        next.push_back({id, at, text.size()});
        start = pos = at + text.size();
      }
      if (start < end) next.push_back({-1, start, end - start});
    }
    frags = std::move(next);
  }

  std::vector<int32_t> ids;
  if (tok.add_bos() && tok.bos() >= 0 && !(frags.size() > 0 && frags[0].id == tok.bos()))
    ids.push_back(tok.bos());
  for (const Frag& f : frags) {
    if (f.id >= 0) {
      ids.push_back(f.id);
      continue;
    }
    const auto part = tok.encode(std::string_view(r.text).substr(f.off, f.len), false, false);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

}  // namespace sy::chat
