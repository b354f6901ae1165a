// GGUF v3 writer: metadata, tensor infos and aligned tensor data. Tensors given by a fill
// callback are produced one at a time while writing, so a model never sits in memory whole.
// The writer checks only what it needs to lay the file out; it can write files the reader
// rejects (duplicate keys, odd alignment values), which the tests use on purpose.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "model/gguf.hpp"

namespace sy::gguf {

namespace {

constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;  // GGUF's default; other values need the key

// Appends little-endian bytes to a buffer (all supported hosts are little-endian, like GGUF).
struct Out {
  std::vector<uint8_t>& b;
  template <class T>
  void put(T x) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &x, sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
};

[[noreturn]] void bad_value(const char* what) {
  throw std::invalid_argument(std::string("gguf writer: value does not hold ") + what);
}

uint64_t get_u(const Value& v) {
  if (auto* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (auto* i = std::get_if<int64_t>(&v.v)) return static_cast<uint64_t>(*i);
  if (auto* b = std::get_if<bool>(&v.v)) return *b;
  bad_value("an integer");
}

double get_d(const Value& v) {
  if (auto* d = std::get_if<double>(&v.v)) return *d;
  bad_value("a float");
}

// Payload only (no type tag): the array element encoding.
void put_payload(Out& o, const Value& v) {
  switch (v.type) {
    case ValueType::UINT8:
    case ValueType::INT8:
      o.put<uint8_t>(static_cast<uint8_t>(get_u(v)));
      break;
    case ValueType::UINT16:
    case ValueType::INT16:
      o.put<uint16_t>(static_cast<uint16_t>(get_u(v)));
      break;
    case ValueType::UINT32:
    case ValueType::INT32:
      o.put<uint32_t>(static_cast<uint32_t>(get_u(v)));
      break;
    case ValueType::UINT64:
    case ValueType::INT64:
      o.put<uint64_t>(get_u(v));
      break;
    case ValueType::FLOAT32:
      o.put<float>(static_cast<float>(get_d(v)));
      break;
    case ValueType::FLOAT64:
      o.put<double>(get_d(v));
      break;
    case ValueType::BOOL:
      o.put<uint8_t>(get_u(v) ? 1 : 0);
      break;
    case ValueType::STRING: {
      auto s = v.as_string();
      if (!s) bad_value("a string");
      o.str(std::string(*s));
      break;
    }
    case ValueType::ARRAY: {
      const Array* a = v.as_array();
      if (!a) bad_value("an array");
      o.put<uint32_t>(static_cast<uint32_t>(a->elem_type));
      o.put<uint64_t>(a->items.size());
      for (const Value& x : a->items) {
        if (x.type != a->elem_type)
          throw std::invalid_argument("gguf writer: array element type differs from the array's");
        put_payload(o, x);
      }
      break;
    }
  }
}

uint64_t pad_to(uint64_t n, uint64_t a) {
  return (n + a - 1) / a * a;
}

Value scalar(ValueType t,
             std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<Array>> x) {
  Value v;
  v.type = t;
  v.v = std::move(x);
  return v;
}

}  // namespace

void Writer::add(std::string key, Value v) {
  kv_.emplace_back(std::move(key), std::move(v));
}
void Writer::add_u32(std::string key, uint32_t x) {
  add(std::move(key), scalar(ValueType::UINT32, uint64_t{x}));
}
void Writer::add_i32(std::string key, int32_t x) {
  add(std::move(key), scalar(ValueType::INT32, int64_t{x}));
}
void Writer::add_f32(std::string key, float x) {
  add(std::move(key), scalar(ValueType::FLOAT32, double{x}));
}
void Writer::add_bool(std::string key, bool x) {
  add(std::move(key), scalar(ValueType::BOOL, x));
}
void Writer::add_string(std::string key, std::string x) {
  add(std::move(key), scalar(ValueType::STRING, std::move(x)));
}
void Writer::add_string_array(std::string key, const std::vector<std::string>& xs) {
  auto a = std::make_shared<Array>();
  a->elem_type = ValueType::STRING;
  a->items.reserve(xs.size());
  for (const auto& s : xs) a->items.push_back(scalar(ValueType::STRING, s));
  add(std::move(key), scalar(ValueType::ARRAY, std::move(a)));
}
void Writer::add_f32_array(std::string key, const std::vector<float>& xs) {
  auto a = std::make_shared<Array>();
  a->elem_type = ValueType::FLOAT32;
  a->items.reserve(xs.size());
  for (float x : xs) a->items.push_back(scalar(ValueType::FLOAT32, double{x}));
  add(std::move(key), scalar(ValueType::ARRAY, std::move(a)));
}
void Writer::add_i32_array(std::string key, const std::vector<int32_t>& xs) {
  auto a = std::make_shared<Array>();
  a->elem_type = ValueType::INT32;
  a->items.reserve(xs.size());
  for (int32_t x : xs) a->items.push_back(scalar(ValueType::INT32, int64_t{x}));
  add(std::move(key), scalar(ValueType::ARRAY, std::move(a)));
}

namespace {
uint64_t tensor_bytes(const std::string& name, kernels::DType type,
                      const std::vector<uint64_t>& dims) {
  if (dims.empty() || dims.size() > 4)
    throw std::invalid_argument("gguf writer: tensor '" + name + "' needs 1 to 4 dims");
  if (!type_known(static_cast<uint32_t>(type)))
    throw std::invalid_argument(
        "gguf writer: tensor '" + name + "' has " + (kernels::dtype_name(type) ? "type " : "") +
        type_label(static_cast<uint32_t>(type)) + ", which has no block layout");
  if (dims[0] % static_cast<uint64_t>(kernels::dtype_block_elems(type)) != 0)
    throw std::invalid_argument("gguf writer: tensor '" + name + "' inner dim not a multiple of " +
                                std::to_string(kernels::dtype_block_elems(type)));
  uint64_t rows = 1;
  for (size_t i = 1; i < dims.size(); ++i) rows *= dims[i];
  return static_cast<uint64_t>(kernels::dtype_row_bytes(type, static_cast<int64_t>(dims[0]))) *
         rows;
}
}  // namespace

void Writer::add_tensor(std::string name, kernels::DType type, std::vector<uint64_t> dims,
                        std::vector<uint8_t> bytes) {
  const uint64_t n = tensor_bytes(name, type, dims);
  if (bytes.size() != n)
    throw std::invalid_argument("gguf writer: tensor '" + name + "' needs " + std::to_string(n) +
                                " bytes, got " + std::to_string(bytes.size()));
  tensors_.push_back({std::move(name), type, std::move(dims), std::move(bytes), nullptr});
}

void Writer::add_tensor(std::string name, kernels::DType type, std::vector<uint64_t> dims,
                        std::function<void(uint8_t* dst, size_t n_bytes)> fill) {
  tensor_bytes(name, type, dims);  // validates
  if (!fill) throw std::invalid_argument("gguf writer: tensor '" + name + "' has no fill");
  tensors_.push_back({std::move(name), type, std::move(dims), {}, std::move(fill)});
}

namespace {

// Header, metadata and tensor infos, padded to the alignment: everything before the data.
std::vector<uint8_t> header_bytes(uint64_t alignment,
                                  const std::vector<std::pair<std::string, Value>>& kv,
                                  const std::vector<std::string>& names,
                                  const std::vector<kernels::DType>& types,
                                  const std::vector<std::vector<uint64_t>>& dims,
                                  const std::vector<uint64_t>& offsets) {
  bool has_alignment_key = false;
  for (const auto& [k, v] : kv) has_alignment_key |= (k == "general.alignment");
  const bool add_key = alignment != kDefaultAlignment && !has_alignment_key;

  std::vector<uint8_t> b;
  Out o{b};
  o.put<uint32_t>(0x46554747);  // "GGUF"
  o.put<uint32_t>(kVersion);
  o.put<uint64_t>(names.size());
  o.put<uint64_t>(kv.size() + (add_key ? 1 : 0));
  if (add_key) {
    o.str("general.alignment");
    o.put<uint32_t>(static_cast<uint32_t>(ValueType::UINT32));
    o.put<uint32_t>(static_cast<uint32_t>(alignment));
  }
  for (const auto& [k, v] : kv) {
    o.str(k);
    o.put<uint32_t>(static_cast<uint32_t>(v.type));
    put_payload(o, v);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    o.str(names[i]);
    o.put<uint32_t>(static_cast<uint32_t>(dims[i].size()));
    for (uint64_t d : dims[i]) o.put<uint64_t>(d);
    o.put<uint32_t>(static_cast<uint32_t>(types[i]));
    o.put<uint64_t>(offsets[i]);
  }
  b.resize(pad_to(b.size(), alignment), 0);
  return b;
}

void check_alignment(uint64_t a) {
  if (a == 0 || (a & (a - 1)) != 0 || a > 0xffffffffull)
    throw std::invalid_argument("gguf writer: alignment must be a power of two, got " +
                                std::to_string(a));
}

}  // namespace

std::vector<uint8_t> Writer::bytes() const {
  check_alignment(alignment_);
  std::vector<std::string> names;
  std::vector<kernels::DType> types;
  std::vector<std::vector<uint64_t>> dims;
  std::vector<uint64_t> offsets, sizes;
  uint64_t off = 0;
  for (const auto& t : tensors_) {
    names.push_back(t.name);
    types.push_back(t.type);
    dims.push_back(t.dims);
    offsets.push_back(off);
    sizes.push_back(tensor_bytes(t.name, t.type, t.dims));
    off = pad_to(off + sizes.back(), alignment_);
  }
  std::vector<uint8_t> out = header_bytes(alignment_, kv_, names, types, dims, offsets);
  const size_t data_start = out.size();
  out.resize(data_start + off, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    uint8_t* dst = out.data() + data_start + offsets[i];
    if (tensors_[i].fill)
      tensors_[i].fill(dst, sizes[i]);
    else
      std::memcpy(dst, tensors_[i].bytes.data(), sizes[i]);
  }
  return out;
}

void Writer::write(const std::string& path) const {
  check_alignment(alignment_);
  std::vector<std::string> names;
  std::vector<kernels::DType> types;
  std::vector<std::vector<uint64_t>> dims;
  std::vector<uint64_t> offsets, sizes;
  uint64_t off = 0, largest = 0;
  for (const auto& t : tensors_) {
    names.push_back(t.name);
    types.push_back(t.type);
    dims.push_back(t.dims);
    offsets.push_back(off);
    sizes.push_back(tensor_bytes(t.name, t.type, t.dims));
    if (t.fill) largest = std::max(largest, sizes.back());
    off = pad_to(off + sizes.back(), alignment_);
  }
  const std::vector<uint8_t> header = header_bytes(alignment_, kv_, names, types, dims, offsets);

  // Write beside the target and rename at the end, so a failed or interrupted run never leaves
  // a truncated file under the final name.
  const std::string tmp = path + ".partial";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot create '" + tmp + "': " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    const int e = errno;
    std::fclose(f);
    std::remove(tmp.c_str());
    throw std::runtime_error("writing '" + path + "' failed (" + what + "): " + std::strerror(e));
  };
  // One buffer reused for every fill tensor: peak memory is the largest tensor, not the model.
  std::vector<uint8_t> buf;
  try {
    buf.resize(largest);
  } catch (const std::bad_alloc&) {
    fail("no memory for a " + std::to_string(largest) + "-byte tensor buffer");
  }
  static const uint8_t zeros[4096] = {};  // padding source; alignments above 4096 loop
  uint64_t written = 0;
  if (std::fwrite(header.data(), 1, header.size(), f) != header.size()) fail("header");
  for (size_t i = 0; i < tensors_.size(); ++i) {
    while (written < offsets[i]) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(offsets[i] - written, sizeof zeros));
      if (std::fwrite(zeros, 1, n, f) != n) fail("padding");
      written += n;
    }
    const uint8_t* src = tensors_[i].bytes.data();
    if (tensors_[i].fill) {
      try {
        tensors_[i].fill(buf.data(), sizes[i]);
      } catch (...) {
        std::fclose(f);
        std::remove(tmp.c_str());
        throw;
      }
      src = buf.data();
    }
    if (std::fwrite(src, 1, sizes[i], f) != sizes[i]) fail("tensor '" + names[i] + "'");
    written += sizes[i];
  }
  while (written < off) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(off - written, sizeof zeros));
    if (std::fwrite(zeros, 1, n, f) != n) fail("padding");
    written += n;
  }
  if (std::fflush(f) != 0) fail("flush");
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("writing '" + path + "' failed (close): " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(e));
  }
}

}  // namespace sy::gguf
