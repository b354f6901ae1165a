// The `chat_template` config key: a built-in name kept as it is, a template file read from the
// config file's folder when relative, and a non-string value refused naming the key.
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <string>

#include "server/config.hpp"
#include "tests/support/temp_dir.hpp"

BOOST_AUTO_TEST_SUITE(test_config_chat)

namespace fs = std::filesystem;

BOOST_AUTO_TEST_CASE(chat_template_key) {
  const sy::test::TempDir dir("sy_config_chat_");
  sy::ServerConfig a;
  sy::load_config_file(dir.write("a.yaml", "chat_template: chatml\n"), a);
  BOOST_TEST(a.chat_template == "chatml");

  sy::ServerConfig b;
  sy::load_config_file(dir.write("b.yaml", "chat_template: templates/t.jinja\n"), b);
  BOOST_TEST(b.chat_template ==
             (fs::path(dir.path()) / "templates/t.jinja").lexically_normal().string());

  sy::ServerConfig c;
  sy::load_config_file(dir.write("c.yaml", "chat_template: /abs/t.jinja\n"), c);
  BOOST_TEST(c.chat_template == "/abs/t.jinja");

  sy::ServerConfig d;
  BOOST_TEST(d.chat_template.empty());  // default: the model file's tokenizer.chat_template
  const std::string bad = dir.write("d.yaml", "chat_template: [1, 2]\n");
  try {
    sy::load_config_file(bad, d);
    BOOST_ERROR("no error");
  } catch (const std::exception& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find("chat_template") != std::string::npos, m);
    BOOST_TEST(m.find(bad) != std::string::npos, m);
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_config_chat
