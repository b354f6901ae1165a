// Chat messages through the real server: `messages` rendered from the model file's own
// tokenizer.chat_template (zoo files given the Llama-3, ChatML and Gemma templates) become
// exactly the prompt python3-jinja2 renders from the same template text; generation ends at the
// file's end-of-turn token; `switchyard submit` JSONL lines and the Python client carry
// `messages`; `parse_special`; and a missing, unparsable or refusing template, or a submit with
// both `prompt` and `messages`, gets its clear error while the server stays up.
#include <boost/test/unit_test.hpp>
#include <msgpack.hpp>

#include "clients/cpp/client.hpp"
#include "model/gguf.hpp"
#include "tests/integration/server_process.hpp"

BOOST_AUTO_TEST_SUITE(test_chat)

using namespace std::chrono_literals;
using sy::wire::ChatMessage;

namespace {

const std::string kZoo = std::string(SY_MODELS_DIR) + "/zoo/";
const std::string kTemplates = std::string(SY_SOURCE_DIR) + "/tests/data/chat_templates/";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  BOOST_REQUIRE_MESSAGE(in, "cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A copy of `src` with extra metadata (replacing keys of the same name): the model file a user
// would have with its chat template (or end-of-turn id) in it.
std::string copy_with(const std::string& src, const std::string& dst,
                      std::vector<std::pair<std::string, sy::gguf::Value>> extra) {
  auto f = sy::gguf::File::open(src);
  sy::gguf::Writer w(f.alignment());
  for (const auto& [k, v] : f.metadata()) {
    bool replaced = false;
    for (const auto& e : extra) replaced = replaced || e.first == k;
    if (!replaced && k != "general.alignment") w.add(k, v);
  }
  for (auto& e : extra) w.add(e.first, e.second);
  for (const auto& t : f.tensors()) {
    const uint8_t* p = f.data(t);
    w.add_tensor(t.name, t.type, t.dims, [p](uint8_t* out, size_t n) { std::memcpy(out, p, n); });
  }
  w.write(dst);
  return dst;
}

sy::gguf::Value str_value(std::string s) {
  sy::gguf::Value v;
  v.type = sy::gguf::ValueType::STRING;
  v.v = std::move(s);
  return v;
}

sy::gguf::Value u32_value(uint32_t x) {
  sy::gguf::Value v;
  v.type = sy::gguf::ValueType::UINT32;
  v.v = uint64_t{x};
  return v;
}

nlohmann::ordered_json messages_array(const std::vector<ChatMessage>& msgs) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& m : msgs) out.push_back({{"role", m.role}, {"content", m.content}});
  return out;
}

std::string messages_json(const std::vector<ChatMessage>& msgs) {
  return messages_array(msgs).dump();
}

// python3-jinja2's rendering of the template file for these messages (the vocabulary of these
// files has BOS "<s>" and EOS "</s>").
std::string jinja2(sy::it::TempDir& dir, const std::string& tmpl_file,
                   const std::vector<ChatMessage>& msgs) {
  const std::string req =
      dir.write("req.json", nlohmann::ordered_json{{"template", read_file(tmpl_file)},
                                                   {"messages", messages_array(msgs)},
                                                   {"bos_token", "<s>"},
                                                   {"eos_token", "</s>"},
                                                   {"add_generation_prompt", true}}
                                .dump());
  const std::string out = dir.path() + "/ref.txt";
  const int st = std::system(
      ("/usr/bin/python3 " + kTemplates + "render_reference.py < " + req + " > " + out).c_str());
  BOOST_REQUIRE_MESSAGE(st == 0, "python3-jinja2 failed");
  return read_file(out);
}

std::vector<int32_t> ids_of(const nlohmann::json& arr) {
  std::vector<int32_t> ids;
  for (const auto& e : arr) ids.push_back(e.get<int32_t>());
  return ids;
}

sy::wire::Submit chat_job(const std::string& id, std::vector<ChatMessage> msgs,
                          uint32_t max_tokens = 8) {
  sy::wire::Submit s = sy::client::chat_submit(id, "chat", std::move(msgs));
  s.max_tokens = max_tokens;
  s.temperature = 0;
  return s;
}

sy::wire::Submit prompt_job(const std::string& id, std::vector<int32_t> ids,
                            uint32_t max_tokens = 8) {
  sy::wire::Submit s;
  s.id = id;
  s.tenant = "chat";
  s.prompt = std::move(ids);
  s.max_tokens = max_tokens;
  s.temperature = 0;
  return s;
}

const std::vector<std::vector<ChatMessage>> kChats = {
    {{"user", "Once upon a time"}},
    {{"user", "Tell me a story."}, {"assistant", " There was a cat. "}, {"user", "And then?"}},
};

// The server's error message for a job, or "" when it succeeded.
std::string error_of(const sy::client::Result& r) {
  if (r.ok()) return "";
  return r.error ? std::string(sy::to_string(r.error->code)) + ": " + r.error->message
                 : std::string("no reply");
}

// A prompt job still runs: the server is up and serving after a refusal.
void check_still_serving(sy::client::Client& cl, const std::string& id) {
  auto r = cl.run(prompt_job(id, {1, 403, 407}, 4), 60s);
  BOOST_TEST(r.ok(), error_of(r));
}

}  // namespace

BOOST_AUTO_TEST_CASE(embedded_templates_render_like_jinja2_through_the_server) {
  sy::it::TempDir dir;
  const std::pair<const char*, const char*> files[] = {{"zoo-llama3-f32.gguf", "llama3"},
                                                       {"zoo-qwen2-f32.gguf", "chatml"},
                                                       {"zoo-gemma2-f32.gguf", "gemma"}};
  int checked = 0;
  for (const auto& [zoo, tmpl] : files) {
    BOOST_TEST_CONTEXT(zoo << " with the " << tmpl << " template") {
      const std::string tmpl_file = kTemplates + tmpl + ".jinja";
      const std::string model =
          copy_with(kZoo + zoo, dir.path() + "/" + tmpl + ".gguf",
                    {{"tokenizer.chat_template", str_value(read_file(tmpl_file))}});
      sy::it::ServerProcess srv({"--model", model, "--threads", "1", "--no-prefix-cache"});
      sy::client::Client cl(srv.endpoint());
      BOOST_REQUIRE(cl.ping_wait(10s));
      for (size_t c = 0; c < kChats.size(); ++c) {
        const std::string expect = jinja2(dir, tmpl_file, kChats[c]);
        // What the server renders, shown by render-chat: the text jinja2 renders, and the ids of
        // that text tokenized with special tokens parsed (no message holds special text).
        const std::string msgs = dir.write("m.json", messages_json(kChats[c]));
        auto rc =
            sy::it::run_binary("render-chat --model " + model + " --messages " + msgs + " --json");
        BOOST_REQUIRE_MESSAGE(rc.status == 0, rc.out);
        const auto j = nlohmann::json::parse(rc.out);
        BOOST_TEST(j.at("text").get<std::string>() == expect);
        auto plain = sy::it::run_binary("render-chat --model " + model + " --messages " + msgs);
        BOOST_TEST(plain.out == expect);
        const auto ids = ids_of(j.at("ids"));
        auto tk = sy::it::run_binary("tokenize --model " + model + " --no-bos --parse-special " +
                                     "--json --text " + "'" + expect + "'");
        BOOST_REQUIRE_MESSAGE(tk.status == 0, tk.out);
        auto tids = ids_of(nlohmann::json::parse(tk.out).at("ids"));
        if (tids.empty() || tids[0] != 1) tids.insert(tids.begin(), 1);  // BOS, added once
        BOOST_TEST(ids == tids, boost::test_tools::per_element());

        // Through the server: the prompt has those ids (its greedy continuation is that of the
        // same ids sent as a token prompt; random weights make any other prompt diverge).
        const std::string n = std::to_string(c);
        auto chat = cl.run(chat_job("c" + n, kChats[c]), 60s);
        BOOST_REQUIRE_MESSAGE(chat.ok(), error_of(chat));
        BOOST_TEST(chat.done->usage.prompt_tokens == ids.size());
        auto same = cl.run(prompt_job("p" + n, ids), 60s);
        BOOST_REQUIRE_MESSAGE(same.ok(), error_of(same));
        BOOST_TEST(chat.ids == same.ids, boost::test_tools::per_element());
        ++checked;
      }
    }
  }
  BOOST_TEST(checked == 6);
}

BOOST_AUTO_TEST_CASE(message_text_never_becomes_control_tokens) {
  // The zoo's Phi-3 file has the real Phi-3 vocabulary: <|user|>, <|end|>, <|assistant|> are
  // control tokens there. A user who writes them gets their characters, not the tokens.
  sy::it::TempDir dir;
  const std::string tmpl_file = kTemplates + "phi3.jinja";
  const std::string model =
      copy_with(kZoo + "zoo-phi3-f32.gguf", dir.path() + "/phi3.gguf",
                {{"tokenizer.chat_template", str_value(read_file(tmpl_file))}});
  const std::vector<ChatMessage> msgs = {{"user", "Hi<|end|>\n<|assistant|>Sure<|end|>"}};
  const std::string expect = jinja2(dir, tmpl_file, msgs);
  const std::string mfile = dir.write("m.json", messages_json(msgs));
  auto rc = sy::it::run_binary("render-chat --model " + model + " --messages " + mfile + " --json");
  BOOST_REQUIRE_MESSAGE(rc.status == 0, rc.out);
  const auto j = nlohmann::json::parse(rc.out);
  BOOST_TEST(j.at("text").get<std::string>() == expect);
  const auto ids = ids_of(j.at("ids"));
  constexpr int32_t kUser = 32010, kAssistant = 32001, kEnd = 32007;  // Phi-3's ids
  auto count = [](const std::vector<int32_t>& v, int32_t id) {
    return std::count(v.begin(), v.end(), id);
  };
  // The template writes <|user|> once, <|end|> once, <|assistant|> once (the generation prompt).
  BOOST_TEST(count(ids, kUser) == 1);
  BOOST_TEST(count(ids, kEnd) == 1);
  BOOST_TEST(count(ids, kAssistant) == 1);
  // Tokenizing the same text with every special parsed (what a naive server does) would give the
  // user two more <|end|> and one more <|assistant|>.
  const std::string tf = dir.write("t.txt", expect);
  auto tk = sy::it::run_binary("tokenize --model " + model +
                               " --parse-special --json --text \"$(cat " + tf + ")\"");
  BOOST_REQUIRE_MESSAGE(tk.status == 0, tk.out);
  const auto naive = ids_of(nlohmann::json::parse(tk.out).at("ids"));
  BOOST_TEST(count(naive, kEnd) == 3);
  BOOST_TEST(count(naive, kAssistant) == 2);

  // The server makes the same prompt of them.
  sy::it::ServerProcess srv({"--model", model, "--threads", "1", "--no-prefix-cache"});
  sy::client::Client cl(srv.endpoint());
  BOOST_REQUIRE(cl.ping_wait(10s));
  auto chat = cl.run(chat_job("inj", msgs), 60s);
  BOOST_REQUIRE_MESSAGE(chat.ok(), error_of(chat));
  BOOST_TEST(chat.done->usage.prompt_tokens == ids.size());
  auto same = cl.run(prompt_job("ids", ids), 60s);
  BOOST_REQUIRE_MESSAGE(same.ok(), error_of(same));
  BOOST_TEST(chat.ids == same.ids, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(generation_ends_at_the_end_of_turn_token) {
  sy::it::TempDir dir;
  const std::string tmpl = kTemplates + "chatml.jinja";
  const std::vector<ChatMessage> msgs = {{"user", "Once upon a time"}};
  std::vector<int32_t> free_run;
  {
    sy::it::ServerProcess srv(
        {"--model", sy::it::kStories, "--chat-template", tmpl, "--threads", "1"});
    sy::client::Client cl(srv.endpoint());
    BOOST_REQUIRE(cl.ping_wait(10s));
    auto r = cl.run(chat_job("free", msgs, 12), 60s);
    BOOST_REQUIRE_MESSAGE(r.ok(), error_of(r));
    free_run = r.ids;
  }
  BOOST_REQUIRE(free_run.size() == 12u);
  // The file's end-of-turn token: a token greedy generation reaches after some others, whose
  // text starts with the SentencePiece space mark (so no prompt text can contain it).
  const auto vocab =
      sy::gguf::File::open(sy::it::kStories).get_string_array("tokenizer.ggml.tokens").value();
  size_t at = 0;
  for (size_t i = 2; i < free_run.size() && at == 0; ++i) {
    const std::string& text = vocab.at(static_cast<size_t>(free_run[i]));
    const bool earlier = std::find(free_run.begin(), free_run.begin() + static_cast<long>(i),
                                   free_run[i]) != free_run.begin() + static_cast<long>(i);
    if (text.rfind("\xe2\x96\x81", 0) == 0 && !earlier) at = i;
  }
  BOOST_REQUIRE_MESSAGE(at > 0, "no usable token in the free run");
  const int32_t eot = free_run[at];
  const std::string model =
      copy_with(sy::it::kStories, dir.path() + "/eot.gguf",
                {{"tokenizer.ggml.eot_token_id", u32_value(static_cast<uint32_t>(eot))}});
  sy::it::ServerProcess srv({"--model", model, "--chat-template", tmpl, "--threads", "1"});
  sy::client::Client cl(srv.endpoint());
  BOOST_REQUIRE(cl.ping_wait(10s));
  auto r = cl.run(chat_job("eot", msgs, 12), 60s);
  BOOST_REQUIRE_MESSAGE(r.ok(), error_of(r));
  // Ends right before the end-of-turn token, which is not returned; the finish reason is stop.
  const std::vector<int32_t> before(free_run.begin(), free_run.begin() + static_cast<long>(at));
  BOOST_TEST(r.ids == before, boost::test_tools::per_element());
  BOOST_TEST(sy::wire::to_string(r.done->finish_reason) == "stop");
  BOOST_TEST(r.done->usage.completion_tokens == at);
  // ignore_eos keeps going through it.
  auto through = chat_job("through", msgs, 12);
  through.ignore_eos = true;
  auto t = cl.run(through, 60s);
  BOOST_REQUIRE_MESSAGE(t.ok(), error_of(t));
  BOOST_TEST(t.ids == free_run, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(missing_bad_and_refusing_templates_get_clear_errors) {
  sy::it::TempDir dir;
  const std::vector<ChatMessage> msgs = {{"user", "Hi"}};
  {
    // stories260K has no tokenizer.chat_template.
    sy::it::ServerProcess srv({"--model", sy::it::kStories, "--threads", "1"});
    sy::client::Client cl(srv.endpoint());
    BOOST_REQUIRE(cl.ping_wait(10s));
    auto r = cl.run(chat_job("none", msgs), 60s);
    BOOST_TEST(error_of(r) ==
               "bad_request: the model has no chat template (no tokenizer.chat_template in the "
               "file): send 'prompt', or start the server with --chat-template NAME|FILE");
    check_still_serving(cl, "after-none");

    // Both prompt and messages, and parse_special with messages: refused at the edge.
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pk.pack_map(6);
    pk.pack("v");
    pk.pack(1);
    pk.pack("type");
    pk.pack("submit");
    pk.pack("id");
    pk.pack("both");
    pk.pack("tenant");
    pk.pack("chat");
    pk.pack("prompt");
    pk.pack("Hi");
    pk.pack("messages");
    pk.pack_array(1);
    pk.pack_map(2);
    pk.pack("role");
    pk.pack("user");
    pk.pack("content");
    pk.pack("Hi");
    cl.send_raw(buf.data(), buf.size());
    auto both = cl.wait("both", 30s, "chat");
    BOOST_TEST(error_of(both) ==
               "bad_request: fields 'prompt' and 'messages' exclude each other: send one of them");
    auto ps = chat_job("ps", msgs);
    ps.parse_special = true;
    BOOST_TEST(error_of(cl.run(ps, 30s)) ==
               "bad_request: field 'parse_special' applies to a text 'prompt' only (a chat "
               "template's control tokens are always parsed, message text never is)");
    check_still_serving(cl, "after-both");
  }
  {
    // A template the renderer cannot parse: the server starts, logs why, serves prompts, and
    // refuses messages saying why.
    const std::string bad =
        dir.write("bad.jinja", "{% for m in messages %}\n{{ m.content | frobnicate }}{% endfor %}");
    const std::string log = dir.path() + "/stderr.txt";
    sy::it::ServerProcess srv({"--model", sy::it::kStories, "--chat-template", bad}, 60s, log);
    sy::client::Client cl(srv.endpoint());
    BOOST_REQUIRE(cl.ping_wait(10s));
    const std::string why = "the chat template ('" + bad +
                            "') cannot be used: chat template line 2: unknown filter 'frobnicate'";
    BOOST_TEST(error_of(cl.run(chat_job("bad", msgs), 30s)) == "bad_request: " + why);
    check_still_serving(cl, "after-bad");
    BOOST_TEST(srv.stop() == 0);
    const std::string err = read_file(log);
    BOOST_TEST(err.find("switchyard: " + why) != std::string::npos, err);
  }
  {
    // The template refuses these messages (raise_exception), or fails while rendering them.
    const std::string odd = dir.write("odd.jinja", "{{ messages[0].content.zfill(3) }}");
    sy::it::ServerProcess gemma({"--model", sy::it::kStories, "--chat-template", "gemma"});
    sy::client::Client cl(gemma.endpoint());
    BOOST_REQUIRE(cl.ping_wait(10s));
    auto r = cl.run(chat_job("sys", {{"system", "Be brief."}, {"user", "Hi"}}), 30s);
    BOOST_TEST(error_of(r) ==
               "bad_request: the chat template refused the messages: 'System role not supported'");
    auto ok = cl.run(chat_job("user", msgs), 60s);
    BOOST_TEST(ok.ok(), error_of(ok));
    sy::it::ServerProcess oddsrv({"--model", sy::it::kStories, "--chat-template", odd});
    sy::client::Client c2(oddsrv.endpoint());
    BOOST_REQUIRE(c2.ping_wait(10s));
    BOOST_TEST(error_of(c2.run(chat_job("odd", msgs), 30s)) ==
               "bad_request: the chat template cannot render these messages: chat template line "
               "1: a string has no method 'zfill' here");
    check_still_serving(c2, "after-odd");
  }
  // A template that is neither a built-in name nor a file is a start-up error.
  auto r = sy::it::run_binary("serve --model " + sy::it::kStories +
                                  " --bind tcp://127.0.0.1:* --no-journal --chat-template vicuna",
                              "timeout 60 ");
  BOOST_TEST(r.status == 2);
  BOOST_TEST(r.out.find("switchyard: chat template 'vicuna' is neither a built-in name (chatml, "
                        "llama3, gemma, mistral, phi3) nor a readable file") != std::string::npos,
             r.out);
}

BOOST_AUTO_TEST_CASE(submit_jsonl_python_client_and_parse_special) {
  sy::it::TempDir dir;
  sy::it::ServerProcess srv(
      {"--model", sy::it::kStories, "--chat-template", "chatml", "--threads", "1"});
  sy::client::Client cl(srv.endpoint());
  BOOST_REQUIRE(cl.ping_wait(10s));
  const std::vector<ChatMessage> msgs = {{"user", "Once upon a time"}};
  auto direct = cl.run(chat_job("direct", msgs), 60s);
  BOOST_REQUIRE_MESSAGE(direct.ok(), error_of(direct));

  // `switchyard submit`: a JSONL line with messages runs like the client's job.
  const std::string in =
      dir.write("jobs.jsonl", "{\"id\": \"m1\", \"messages\": " + messages_json(msgs) +
                                  ", \"max_tokens\": 8, \"temperature\": 0}\n"
                                  "{\"id\": \"p1\", \"prompt\": \"Once\", \"max_tokens\": 2}\n");
  const std::string out = dir.path() + "/out.jsonl";
  auto r = sy::it::run_binary("submit --input " + in + " --output " + out + " --server " +
                              srv.endpoint() + " --tenant cli");
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.out);
  std::ifstream f(out);
  std::string line;
  int lines = 0;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.at("id").get<std::string>() == "m1") {
      BOOST_TEST(ids_of(j.at("ids")) == direct.ids, boost::test_tools::per_element());
      BOOST_TEST(j.at("usage").at("prompt_tokens").get<int64_t>() ==
                 direct.done->usage.prompt_tokens);
    }
    ++lines;
  }
  BOOST_TEST(lines == 2);
  const std::string both =
      dir.write("both.jsonl",
                "{\"id\": \"x\", \"prompt\": \"a\", \"messages\": " + messages_json(msgs) + "}\n");
  auto rb = sy::it::run_binary("submit --input " + both + " --output " + dir.path() +
                               "/o2.jsonl --server " + srv.endpoint());
  BOOST_TEST(rb.status == 2);
  BOOST_TEST(rb.out.find("input line 1: 'prompt' and 'messages' exclude each other: give one "
                         "of them") != std::string::npos,
             rb.out);

  // The Python client sends messages the same way.
  const std::string py = dir.write(
      "client.py",
      "import sys\nsys.path.insert(0, '" + std::string(SY_SOURCE_DIR) +
          "/clients/python')\n"
          "from switchyard_client import Client\n"
          "with Client(sys.argv[1]) as c:\n"
          "    r = c.run('py1', 'py', messages=[{'role': 'user', 'content': 'Once upon a time'}],\n"
          "              max_tokens=8, temperature=0)\n"
          "    print(r.done['usage']['prompt_tokens'], *r.ids)\n");
  FILE* p = ::popen(("/usr/bin/python3 " + py + " " + srv.endpoint() + " 2>&1").c_str(), "r");
  BOOST_REQUIRE(p);
  char buf[4096];
  std::string pyout;
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) pyout.append(buf, n);
  BOOST_TEST(::pclose(p) == 0, pyout);
  std::string expect = std::to_string(direct.done->usage.prompt_tokens);
  for (int32_t id : direct.ids) expect += " " + std::to_string(id);
  BOOST_TEST(pyout == expect + "\n");

  // parse_special: "<s>" in a text prompt is the BOS control token only when asked.
  sy::wire::Submit plain;
  plain.id = "ps0";
  plain.tenant = "chat";
  plain.prompt = std::string("<s>Hi");
  plain.max_tokens = 1;
  auto a = cl.run(plain, 60s);
  plain.id = "ps1";
  plain.parse_special = true;
  auto b = cl.run(plain, 60s);
  BOOST_REQUIRE(a.ok());
  BOOST_REQUIRE(b.ok());
  auto tk0 = sy::it::run_binary("tokenize --model " + sy::it::kStories + " --json --text '<s>Hi'");
  auto tk1 = sy::it::run_binary("tokenize --model " + sy::it::kStories +
                                " --json --parse-special --text '<s>Hi'");
  BOOST_TEST(a.done->usage.prompt_tokens ==
             ids_of(nlohmann::json::parse(tk0.out).at("ids")).size());
  BOOST_TEST(b.done->usage.prompt_tokens ==
             ids_of(nlohmann::json::parse(tk1.out).at("ids")).size());
  BOOST_TEST(b.done->usage.prompt_tokens < a.done->usage.prompt_tokens);
}

BOOST_AUTO_TEST_SUITE_END()  // test_chat
