// `switchyard render-chat`: the server's rendering of `messages` (model/chat_template.hpp), run
// locally so that users can see and check the exact prompt text and ids a chat job gets.
#include "cli/chat.hpp"

#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/demo_model.hpp"
#include "cli/json.hpp"
#include "model/chat_template.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

namespace sy::cli {

const char* const kRenderChatUsage =
    "  render-chat [--model FILE] [--chat-template NAME|FILE] --messages FILE.json\n"
    "              [--no-generation-prompt] [--json]\n"
    "              Prints the prompt that a submit with these messages (a JSON array of\n"
    "              {\"role\", \"content\"}) becomes on a server with this model and template;\n"
    "              --json: {\"text\", \"ids\"}, the ids as the server tokenizes them.\n";
const std::vector<std::string> kRenderChatOptions = {"model", "chat-template", "messages"};
const std::vector<std::string> kRenderChatFlags = {"json", "no-generation-prompt"};

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read --messages file '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<chat::Message> parse_messages(const std::string& path) {
  Json j;
  try {
    j = Json::parse(read_all(path));
  } catch (const Json::exception& e) {
    throw UsageError(path + ": " + e.what());
  }
  if (!j.is_array() || j.empty())
    throw UsageError(path + ": expected a non-empty JSON array of {\"role\", \"content\"}");
  std::vector<chat::Message> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const Json& m = j[i];
    const bool ok = m.is_object() && m.contains("role") && m["role"].is_string() &&
                    m.contains("content") && m["content"].is_string();
    if (!ok)
      throw UsageError(path + ": message " + std::to_string(i) +
                       " must be an object with string 'role' and 'content'");
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

}  // namespace

int cmd_render_chat(const Args& a) {
  if (!a.has("messages")) throw UsageError("render-chat needs --messages FILE.json");
  const auto messages = parse_messages(a.str("messages"));
  const std::string path = a.has("model") ? a.str("model") : demo_model_path();
  auto file = gguf::File::open(path);
  auto tok = Tokenizer::from_gguf(file);
  std::string text;
  if (a.has("chat-template")) {
    try {
      text = chat::load_template_text(a.str("chat-template"));
    } catch (const std::runtime_error& e) {
      throw UsageError(e.what());
    }
  } else if (auto t = file.get_string("tokenizer.chat_template")) {
    text = *t;
  }
  if (text.empty())
    throw std::runtime_error(path +
                             " has no chat template (tokenizer.chat_template); pass "
                             "--chat-template NAME|FILE");
  const chat::ChatTemplate tmpl(text);  // TemplateError names the line
  chat::RenderOptions o;
  if (tok->bos() >= 0) o.bos_token = tok->token_text(tok->bos());
  if (tok->eos() >= 0) o.eos_token = tok->token_text(tok->eos());
  o.add_generation_prompt = !a.has("no-generation-prompt");
  chat::Rendered r;
  try {
    r = tmpl.render(messages, o);
  } catch (const chat::TemplateRaised& e) {
    std::cerr << "switchyard: the chat template refused the messages: " << e.what() << "\n";
    return 1;
  }
  if (!a.has("json")) {
    std::cout << r.text << std::flush;
    return 0;
  }
  const auto ids = chat::tokenize_rendered(*tok, r);
  Json out;
  out["text"] = r.text;
  out["ids"] = ids;
  std::cout << json_dump(out, JsonLayout::spaced) << std::endl;
  return 0;
}

}  // namespace sy::cli
