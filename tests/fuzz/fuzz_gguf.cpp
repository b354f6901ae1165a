// libFuzzer entry point for the GGUF reader: any input must parse or raise gguf::Error, never
// crash, leak or read outside the buffer (built with ASan and UBSan by tests/fuzz/CMakeLists.txt).
#include <cstddef>
#include <cstdint>

#include "model/gguf.hpp"

namespace {

// Walks a value the way consumers do, so accessor bugs show up too.
size_t touch(const sy::gguf::Value& v) {
  size_t h = static_cast<size_t>(v.type);
  if (auto i = v.as_int()) h += static_cast<size_t>(*i);
  if (auto f = v.as_float()) h += *f > 0;
  if (auto s = v.as_string()) h += s->size() ? static_cast<unsigned char>(s->front()) : 0;
  if (const auto* a = v.as_array())
    for (const auto& x : a->items) h += touch(x);
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const sy::gguf::File f = sy::gguf::File::from_memory(data, size);
    volatile size_t sink = f.version() + f.alignment();
    for (const auto& [key, v] : f.metadata()) {
      sink = sink + touch(v) + (f.find(key) == &v);
      if (auto xs = f.get_string_array(key)) sink = sink + xs->size();
      if (auto xs = f.get_float_array(key)) sink = sink + xs->size();
      if (auto xs = f.get_int_array(key)) sink = sink + xs->size();
      sink = sink + f.get_int(key).has_value() + f.get_float(key).has_value() +
             f.get_string(key).has_value();
    }
    for (const auto& t : f.tensors()) {
      const uint8_t* p = f.data(t);
      // first and last byte: ASan reports any tensor the reader let past its bounds
      sink = sink + p[0] + p[t.n_bytes - 1] + (f.tensor(t.name) == &t);
      sink = sink + static_cast<size_t>(
                        sy::kernels::dtype_row_bytes(t.type, static_cast<int64_t>(t.dims[0])));
    }
    (void)sink;
  } catch (const sy::gguf::Error&) {
    // the expected outcome for malformed input
  }
  return 0;
}
