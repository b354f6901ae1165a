// The journal's record codec over msgpack: one field list per record, read by the encoder (which
// counts the map from it), and by the decoder.
#include "storage/journal_codec.hpp"

#include <msgpack.hpp>
#include <stdexcept>
#include <string_view>
#include <type_traits>

namespace sy::journal {
namespace {

// The fields of each record, named as in the file. `v(name, member)` sees each in order; J is
// the record type, const when encoding.
template <class V, class J>
void job_fields(V& v, J& j) {
  v("id", j.id);
  v("tenant", j.tenant);
  v("client", j.client);
  v("class_index", j.class_index);
  v("prompt", j.prompt);
  v("max_tokens", j.max_tokens);
  v("temperature", j.temperature);
  v("top_k", j.top_k);
  v("top_p", j.top_p);
  v("seed", j.seed);
  v("stop", j.stop);
  v("ignore_eos", j.ignore_eos);
  v("stream", j.stream);
  v("logprobs", j.logprobs);
  v("controls", j.controls);
  v("constraint", j.constraint);
  v("n", j.n);
  v("prompt_logprobs", j.prompt_logprobs);
  v("continuations", j.continuations);
  v("program", j.program);
  v("inputs", j.inputs);
  v("program_done", j.program_done);
  v("speculative", j.speculative);
}

template <class V, class C>
void choice_fields(V& v, C& c) {
  v("index", c.index);
  v("finish", c.finish);
  v("text", c.text);
  v("ids", c.ids);
  v("logprob", c.logprob);
  v("top_ids", c.top_ids);
  v("top_logprobs", c.top_logprobs);
}

template <class V, class S>
void score_fields(V& v, S& s) {
  v("index", s.index);
  v("logprob", s.logprob);
  v("tokens", s.tokens);
}

template <class V, class D>
void done_fields(V& v, D& d) {
  v("to", d.to);
  v("uid", d.uid);
  v("id", d.id);
  v("tenant", d.tenant);
  v("finish", d.finish);
  v("text", d.text);
  v("ids", d.ids);
  v("prompt_tokens", d.prompt_tokens);
  v("completion_tokens", d.completion_tokens);
  v("cached_tokens", d.cached_tokens);
  v("queue_ms", d.queue_ms);
  v("ttft_ms", d.ttft_ms);
  v("total_ms", d.total_ms);
  v("logprob", d.logprob);
  v("n_top", d.n_top);
  v("top_ids", d.top_ids);
  v("top_logprobs", d.top_logprobs);
  v("choices", d.choices);
  v("prompt_ids", d.prompt_ids);
  v("prompt_logprob", d.prompt_logprob);
  v("prompt_n_top", d.prompt_n_top);
  v("prompt_top_ids", d.prompt_top_ids);
  v("prompt_top_logprobs", d.prompt_top_logprobs);
  v("scores", d.scores);
  v("vars", d.vars);
  v("steps", d.steps);
}

template <class V, class E>
void error_fields(V& v, E& e) {
  v("to", e.to);
  v("uid", e.uid);
  v("id", e.id);
  v("tenant", e.tenant);
  v("code", e.code);
  v("message", e.message);
  v("retry_after_ms", e.retry_after_ms);
}

template <class V, class O>
void outcome_fields(V& v, O& o) {
  v("id", o.id);
  v("tenant", o.tenant);
  v("outcome", o.outcome);
  v("code", o.code);
  v("tokens_used", o.tokens_used);
}

// ---- encoding ----

using Packer = msgpack::packer<msgpack::sbuffer>;

struct Counter {
  uint32_t n = 0;
  template <class T>
  void operator()(const char*, const T&) {
    ++n;
  }
};

template <class Fields, class R>
uint32_t count(Fields fields, const R& r) {
  Counter c;
  fields(c, r);
  return c.n;
}

struct Writer {
  Packer& p;
  template <class T>
  void operator()(const char* name, const T& value) {
    p.pack(name);
    put(value);
  }
  void put(SpecMode m) { p.pack(static_cast<uint8_t>(m)); }
  void put(const ClientRef& c) {
    p.pack_array(2);
    p.pack(static_cast<uint8_t>(c.kind));
    p.pack(c.identity);
  }
  void put(const SamplingControls& c) {
    p.pack_array(6);
    p.pack(c.min_p);
    p.pack(c.presence_penalty);
    p.pack(c.frequency_penalty);
    p.pack(c.repetition_penalty);
    p.pack(c.repeat_last_n);
    p.pack_array(static_cast<uint32_t>(c.logit_bias.size()));
    for (const auto& [id, bias] : c.logit_bias) {
      p.pack_array(2);
      p.pack(id);
      p.pack(bias);
    }
  }
  void put(const Constraint& c) {
    p.pack_array(3);
    p.pack(c.kind);
    p.pack(c.source);
    p.pack(c.options);
  }
  void put(const DoneEvent& d) {
    map(d, [](auto& v, auto& r) { done_fields(v, r); });
  }
  void put(const ChoiceResult& c) {
    map(c, [](auto& v, auto& r) { choice_fields(v, r); });
  }
  void put(const ScoreResult& s) {
    map(s, [](auto& v, auto& r) { score_fields(v, r); });
  }
  template <class T>
  void put(const std::vector<T>& xs) requires(std::is_same_v<T, ChoiceResult> ||
                                              std::is_same_v<T, ScoreResult>) {
    p.pack_array(static_cast<uint32_t>(xs.size()));
    for (const T& x : xs) put(x);
  }
  void put(const ErrorEvent& e) {
    map(e, [](auto& v, auto& r) { error_fields(v, r); });
  }
  void put(const std::vector<wire::Var>& vs) {
    p.pack_array(static_cast<uint32_t>(vs.size()));
    for (const wire::Var& x : vs) {
      p.pack_array(3);
      p.pack(x.name);
      p.pack(x.values);
      p.pack(x.list);
    }
  }
  template <class T>
  void put(const T& value) {
    if constexpr (std::is_enum_v<T>)
      p.pack(static_cast<std::underlying_type_t<T>>(value));
    else
      p.pack(value);
  }
  template <class R, class Fields>
  void map(const R& r, Fields fields) {
    p.pack_map(count(fields, r));
    fields(*this, r);
  }
};

void put_head(Writer& w, RecordKind kind, uint64_t uid) {
  w("t", std::string(1, static_cast<char>(kind)));
  w("uid", uid);
}

// ---- decoding ----

// Named-field access to a decoded map.
struct Reader {
  const msgpack::object* obj = nullptr;
  explicit Reader(const msgpack::object& o) : obj(&o) {
    if (o.type != msgpack::type::MAP) throw std::runtime_error("record is not a map");
  }
  const msgpack::object* find(std::string_view key) const {
    for (uint32_t i = 0; i < obj->via.map.size; ++i) {
      const auto& kv = obj->via.map.ptr[i];
      if (kv.key.type == msgpack::type::STR &&
          std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) == key)
        return &kv.val;
    }
    return nullptr;
  }
  template <class T>
  void operator()(const char* name, T& out) const {
    if (auto v = find(name)) get(*v, out);
  }
  static void get(const msgpack::object& v, SpecMode& out) {
    const auto m = v.as<uint8_t>();
    out = m <= static_cast<uint8_t>(SpecMode::always) ? static_cast<SpecMode>(m)
                                                      : SpecMode::server_default;
  }
  static void get(const msgpack::object& v, ClientRef& out) {
    if (v.type != msgpack::type::ARRAY || v.via.array.size != 2)
      throw std::runtime_error("bad client field");
    get(v.via.array.ptr[0], out.kind);
    v.via.array.ptr[1].convert(out.identity);
  }
  static void get(const msgpack::object& v, SamplingControls& out) {
    if (v.type != msgpack::type::ARRAY || v.via.array.size != 6)
      throw std::runtime_error("bad controls field");
    const msgpack::object* a = v.via.array.ptr;
    a[0].convert(out.min_p);
    a[1].convert(out.presence_penalty);
    a[2].convert(out.frequency_penalty);
    a[3].convert(out.repetition_penalty);
    a[4].convert(out.repeat_last_n);
    if (a[5].type != msgpack::type::ARRAY) throw std::runtime_error("bad logit_bias field");
    for (uint32_t i = 0; i < a[5].via.array.size; ++i) {
      const msgpack::object& e = a[5].via.array.ptr[i];
      if (e.type != msgpack::type::ARRAY || e.via.array.size != 2)
        throw std::runtime_error("bad logit_bias entry");
      out.logit_bias.emplace_back(e.via.array.ptr[0].as<int32_t>(), e.via.array.ptr[1].as<float>());
    }
  }
  static void get(const msgpack::object& v, Constraint& out) {
    if (v.type != msgpack::type::ARRAY || v.via.array.size != 3)
      throw std::runtime_error("bad constraint field");
    v.via.array.ptr[0].convert(out.kind);
    v.via.array.ptr[1].convert(out.source);
    v.via.array.ptr[2].convert(out.options);
  }
  static void get(const msgpack::object& v, DoneEvent& out) {
    Reader r(v);
    done_fields(r, out);
  }
  static void get(const msgpack::object& v, std::vector<wire::Var>& out) {
    if (v.type != msgpack::type::ARRAY) throw std::runtime_error("bad vars field");
    out.resize(v.via.array.size);
    for (uint32_t i = 0; i < v.via.array.size; ++i) {
      const msgpack::object& e = v.via.array.ptr[i];
      if (e.type != msgpack::type::ARRAY || e.via.array.size != 3)
        throw std::runtime_error("bad var entry");
      e.via.array.ptr[0].convert(out[i].name);
      e.via.array.ptr[1].convert(out[i].values);
      e.via.array.ptr[2].convert(out[i].list);
    }
  }
  static void get(const msgpack::object& v, ErrorEvent& out) {
    Reader r(v);
    error_fields(r, out);
  }
  static void get(const msgpack::object& v, ChoiceResult& out) {
    Reader r(v);
    choice_fields(r, out);
  }
  static void get(const msgpack::object& v, ScoreResult& out) {
    Reader r(v);
    score_fields(r, out);
  }
  template <class T>
  static void get(const msgpack::object& v,
                  std::vector<T>& out) requires(std::is_same_v<T, ChoiceResult> ||
                                                std::is_same_v<T, ScoreResult>) {
    if (v.type != msgpack::type::ARRAY) throw std::runtime_error("bad list field");
    out.resize(v.via.array.size);
    for (uint32_t i = 0; i < v.via.array.size; ++i) get(v.via.array.ptr[i], out[i]);
  }
  template <class T>
  static void get(const msgpack::object& v, T& out) {
    if constexpr (std::is_enum_v<T>) {
      std::underlying_type_t<T> raw{};
      v.convert(raw);
      out = static_cast<T>(raw);
    } else {
      v.convert(out);
    }
  }
};

std::string text_of(const msgpack::sbuffer& buf) {
  return std::string(buf.data(), buf.size());
}

}  // namespace

std::string encode_accept(const Job& j, int64_t deadline_wall_us) {
  msgpack::sbuffer buf;
  Packer p(buf);
  Writer w{p};
  p.pack_map(2 + count([](auto& v, auto& r) { job_fields(v, r); }, j) +
             (deadline_wall_us > 0 ? 1 : 0));
  if (deadline_wall_us > 0) w("deadline_wall_us", deadline_wall_us);
  put_head(w, RecordKind::accept, j.uid);
  job_fields(w, j);
  return text_of(buf);
}

std::string encode_result(const JobOutcome& o) {
  msgpack::sbuffer buf;
  Packer p(buf);
  Writer w{p};
  p.pack_map(2 + count([](auto& v, auto& r) { outcome_fields(v, r); }, o) + 1);
  put_head(w, RecordKind::result, o.uid);
  outcome_fields(w, o);
  // Only the event that ends the job is kept: the other one is empty.
  if (o.outcome == Outcome::error)
    w("error", o.error);
  else
    w("done", o.done);
  return text_of(buf);
}

std::string encode_delivered(uint64_t uid) {
  msgpack::sbuffer buf;
  Packer p(buf);
  Writer w{p};
  p.pack_map(2);
  put_head(w, RecordKind::delivered, uid);
  return text_of(buf);
}

std::string encode_step(const ProgramStep& s) {
  msgpack::sbuffer buf;
  Packer p(buf);
  Writer w{p};
  p.pack_map(4);
  put_head(w, RecordKind::step, s.uid);
  w("path", s.path);
  w("output", s.output);
  return text_of(buf);
}

Record decode(const std::string& payload) {
  auto oh = msgpack::unpack(payload.data(), payload.size());
  Reader f(oh.get());
  Record d;
  std::string t;
  f("t", t);
  if (t.size() != 1) throw std::runtime_error("record without a kind");
  f("uid", d.uid);
  switch (static_cast<RecordKind>(t[0])) {
    case RecordKind::accept:
      d.kind = RecordKind::accept;
      d.job.uid = d.uid;
      job_fields(f, d.job);
      f("deadline_wall_us", d.deadline_wall_us);
      break;
    case RecordKind::result:
      d.kind = RecordKind::result;
      d.outcome.uid = d.uid;
      outcome_fields(f, d.outcome);
      f("done", d.outcome.done);
      f("error", d.outcome.error);
      break;
    case RecordKind::delivered:
      d.kind = RecordKind::delivered;
      break;
    case RecordKind::step:
      d.kind = RecordKind::step;
      f("path", d.path);
      f("output", d.output);
      break;
    default:
      throw std::runtime_error("unknown record kind");
  }
  return d;
}

}  // namespace sy::journal
