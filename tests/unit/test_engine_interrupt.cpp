// The CPU engine's Engine::interrupt_on: a step whose flag is raised stops inside its layers
// (StepInterrupted) after writing some of its K/V; feeding the same tokens again at the same
// slots gives exactly the logits of a step never stopped, even where the stopped step wrote
// other tokens' K/V there. A clear flag, and the reference path, run every step to its end.
#include <algorithm>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <memory>
#include <vector>

#include "gpu/engine.hpp"
#include "tests/support/reference.hpp"
#include "tests/support/seq_step.hpp"
#include "tests/support/stories.hpp"

BOOST_AUTO_TEST_SUITE(test_engine_interrupt)

namespace {

using sy::test::seq_step;

struct Fixture {
  explicit Fixture(sy::kernels::DType kv, bool reference = false) {
    sy::EngineOptions o;
    o.block_size = 8;
    o.n_blocks = 16;
    o.kv_type = kv;
    o.reference = reference;
    e = sy::make_cpu_engine(sy::test::stories_model(), o);
    const std::vector<int32_t> p = sy::test::reference_text();
    n = static_cast<int32_t>(p.size());
    head.assign(p.begin(), p.begin() + k);
    rest.assign(p.begin() + k, p.end());
    wrong.assign(rest.rbegin(), rest.rend());
    last.assign(p.end() - 1, p.end());
    for (int32_t i = 0; i < (n + 7) / 8; ++i) tab.push_back(*e->pool().alloc());
  }
  std::vector<float> last_row(const sy::SeqStep& s) {
    e->step({s}, out);
    return std::vector<float>(out.row(0), out.row(0) + out.n_vocab);
  }
  std::unique_ptr<sy::Engine> e;
  sy::StepOutput out;
  const int32_t k = 10;
  int32_t n = 0;
  std::vector<int32_t> head, rest, wrong, last, tab;
};

// Largest absolute difference; infinite where either side is not finite (or the sizes differ).
float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    d = std::max(d, std::fabs(a[i] - b[i]));
  }
  return d;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_stopped_step_fed_again_gives_the_logits_of_one_never_stopped) {
  for (auto kv : {sy::kernels::DType::F32, sy::kernels::DType::F16}) {
    BOOST_TEST_CONTEXT("kv " << sy::kernels::kv_type_name(kv)) {
      BOOST_REQUIRE(sy::test::stories_model()->config().n_layers > 1);
      Fixture clean(kv);
      clean.e->step({seq_step(clean.head, 0, clean.tab)}, clean.out);
      const std::vector<float> want = clean.last_row(seq_step(clean.rest, clean.k, clean.tab));

      Fixture f(kv);
      std::atomic<bool> flag{false};
      f.e->interrupt_on(&flag);
      f.e->step({seq_step(f.head, 0, f.tab)}, f.out);  // a clear flag: to the end
      flag = true;
      BOOST_CHECK_THROW(f.e->step({seq_step(f.wrong, f.k, f.tab)}, f.out), sy::StepInterrupted);
      flag = false;
      const std::vector<float> got = f.last_row(seq_step(f.rest, f.k, f.tab));
      BOOST_TEST(max_diff(got, want) == 0.0f);  // the same K/V, the same arithmetic

      // The stopped step did write before it stopped: over a cache that holds the right
      // tokens' K/V in every layer, its first layer's K/V of the wrong tokens changes what a
      // step reading those slots (without feeding them again) computes.
      Fixture dirty(kv), untouched(kv);
      dirty.e->interrupt_on(&flag);
      for (Fixture* x : {&dirty, &untouched}) {
        x->e->step({seq_step(x->head, 0, x->tab)}, x->out);
        x->e->step({seq_step(x->rest, x->k, x->tab)}, x->out);
      }
      flag = true;
      BOOST_CHECK_THROW(dirty.e->step({seq_step(dirty.wrong, dirty.k, dirty.tab)}, dirty.out),
                        sy::StepInterrupted);
      flag = false;
      const std::vector<float> a = dirty.last_row(seq_step(dirty.last, dirty.n - 1, dirty.tab));
      const std::vector<float> b =
          untouched.last_row(seq_step(untouched.last, untouched.n - 1, untouched.tab));
      BOOST_TEST(max_diff(a, a) == 0.0f);  // both finite
      BOOST_TEST(max_diff(b, b) == 0.0f);
      BOOST_TEST(max_diff(a, b) > 0.0f);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_reference_path_runs_every_step_to_its_end) {
  Fixture f(sy::kernels::DType::F32, true);
  std::atomic<bool> flag{true};
  f.e->interrupt_on(&flag);
  BOOST_CHECK_NO_THROW(f.e->step({seq_step(f.head, 0, f.tab)}, f.out));
  BOOST_TEST(f.out.n_vocab > 0);
}

BOOST_AUTO_TEST_SUITE_END()
