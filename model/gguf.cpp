// GGUF reader: parses the header, metadata and tensor infos of a memory-mapped file, checking
// every count, length and offset against the bytes that are really there before using it.
#include "model/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

namespace sy::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
// Nested arrays are allowed by the format, but each level costs a stack frame here; real files
// use at most one level (arrays of strings), so a small bound stops stack exhaustion.
constexpr int kMaxArrayDepth = 8;
// ggml tensors have at most 4 dimensions (GGML_MAX_DIMS).
constexpr uint32_t kMaxDims = 4;

// Smallest encoding of one value of type t, used to bound counts by the bytes left before
// allocating anything: a string is at least its 8-byte length, an array its type and count.
uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL:
      return 1;
    case ValueType::UINT16:
    case ValueType::INT16:
      return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32:
      return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
      return 8;
    case ValueType::STRING:
      return 8;
    case ValueType::ARRAY:
      return 12;
  }
  return 1;
}

bool valid_value_type(uint32_t t) {
  return t <= static_cast<uint32_t>(ValueType::FLOAT64);
}

// Bounds-checked little-endian reader over the file bytes.
class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size) : base_(base), size_(size) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      throw Error(std::string("truncated: ") + what + " at offset " + std::to_string(pos_) +
                  " needs " + std::to_string(n) + " bytes, file has " +
                  std::to_string(remaining()) + " left");
  }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T x;
    std::memcpy(&x, base_ + pos_, sizeof(T));  // memcpy: the file gives no alignment guarantee
    pos_ += sizeof(T);
    return x;
  }

  std::string read_string(const char* what) {
    const size_t at = pos_;
    const uint64_t n = read<uint64_t>(what);
    if (n > remaining())
      throw Error(std::string("truncated or corrupt: string length ") + std::to_string(n) + " of " +
                  what + " at offset " + std::to_string(at) + " exceeds the " +
                  std::to_string(remaining()) + " bytes left in the file");
    std::string s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }

  void skip(uint64_t n, const char* what) {
    need(n, what);
    pos_ += n;
  }

 private:
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
};

Value read_value(Cursor& c, ValueType type, const std::string& key, int depth);

Value read_scalar_or_string(Cursor& c, ValueType type) {
  Value v;
  v.type = type;
  switch (type) {
    case ValueType::UINT8:
      v.v = uint64_t{c.read<uint8_t>("uint8 value")};
      break;
    case ValueType::INT8:
      v.v = int64_t{c.read<int8_t>("int8 value")};
      break;
    case ValueType::UINT16:
      v.v = uint64_t{c.read<uint16_t>("uint16 value")};
      break;
    case ValueType::INT16:
      v.v = int64_t{c.read<int16_t>("int16 value")};
      break;
    case ValueType::UINT32:
      v.v = uint64_t{c.read<uint32_t>("uint32 value")};
      break;
    case ValueType::INT32:
      v.v = int64_t{c.read<int32_t>("int32 value")};
      break;
    case ValueType::UINT64:
      v.v = c.read<uint64_t>("uint64 value");
      break;
    case ValueType::INT64:
      v.v = c.read<int64_t>("int64 value");
      break;
    case ValueType::FLOAT32:
      v.v = double{c.read<float>("float32 value")};
      break;
    case ValueType::FLOAT64:
      v.v = c.read<double>("float64 value");
      break;
    // Any nonzero byte reads as true, as in ggml's own reader.
    case ValueType::BOOL:
      v.v = c.read<uint8_t>("bool value") != 0;
      break;
    case ValueType::STRING:
      v.v = c.read_string("string value");
      break;
    case ValueType::ARRAY:
      break;  // handled by read_value
  }
  return v;
}

Value read_value(Cursor& c, ValueType type, const std::string& key, int depth) {
  if (type != ValueType::ARRAY) return read_scalar_or_string(c, type);
  if (depth >= kMaxArrayDepth)
    throw Error("metadata key '" + key + "': arrays nested deeper than " +
                std::to_string(kMaxArrayDepth) + " levels");
  const size_t at = c.pos();
  const uint32_t et = c.read<uint32_t>("array element type");
  if (!valid_value_type(et))
    throw Error("metadata key '" + key + "': unknown array element value type " +
                std::to_string(et) + " at offset " + std::to_string(at));
  const auto elem = static_cast<ValueType>(et);
  const size_t count_at = c.pos();
  const uint64_t n = c.read<uint64_t>("array count");
  if (n > c.remaining() / min_value_bytes(elem))
    throw Error("truncated or corrupt: metadata key '" + key + "': array count " +
                std::to_string(n) + " at offset " + std::to_string(count_at) +
                " exceeds what the " + std::to_string(c.remaining()) +
                " bytes left in the file can hold");
  auto arr = std::make_shared<Array>();
  arr->elem_type = elem;
  arr->items.reserve(n);
  for (uint64_t i = 0; i < n; ++i) arr->items.push_back(read_value(c, elem, key, depth + 1));
  Value v;
  v.type = ValueType::ARRAY;
  v.v = std::move(arr);
  return v;
}

std::string hex32(uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", x);
  return buf;
}

}  // namespace

// ---- type helpers ----

bool type_known(uint32_t t) {
  return kernels::dtype_block_bytes(static_cast<kernels::DType>(t)) > 0;
}

std::string type_label(uint32_t t) {
  const char* name = kernels::dtype_name(static_cast<kernels::DType>(t));
  if (name == nullptr) return "unknown type " + std::to_string(t);
  return std::string(name) + " (" + std::to_string(t) + ")";
}

// ---- Value accessors ----

std::optional<int64_t> Value::as_int() const {
  if (auto* u = std::get_if<uint64_t>(&v)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  if (auto* i = std::get_if<int64_t>(&v)) return *i;
  if (auto* b = std::get_if<bool>(&v)) return *b ? 1 : 0;
  return std::nullopt;
}

std::optional<double> Value::as_float() const {
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (auto* u = std::get_if<uint64_t>(&v)) return static_cast<double>(*u);
  if (auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<std::string_view> Value::as_string() const {
  if (auto* s = std::get_if<std::string>(&v)) return std::string_view(*s);
  return std::nullopt;
}

const Array* Value::as_array() const {
  if (auto* a = std::get_if<std::shared_ptr<Array>>(&v)) return a->get();
  return nullptr;
}

// ---- File ----

File::File(File&& o) noexcept {
  *this = std::move(o);
}

File& File::operator=(File&& o) noexcept {
  if (this == &o) return *this;
  if (map_) munmap(map_, map_size_);
  version_ = o.version_;
  alignment_ = o.alignment_;
  kv_ = std::move(o.kv_);
  tensors_ = std::move(o.tensors_);
  base_ = o.base_;
  size_ = o.size_;
  data_start_ = o.data_start_;
  map_ = o.map_;
  map_size_ = o.map_size_;
  o.map_ = nullptr;
  o.map_size_ = 0;
  o.base_ = nullptr;
  o.size_ = 0;
  return *this;
}

File::~File() {
  if (map_) munmap(map_, map_size_);
}

File File::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error("cannot stat '" + path + "': " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("'" + path + "' is not a regular file");
  }
  File f;
  const auto size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    // MAP_PRIVATE + PROT_READ: the weights are paged in on demand and shared with the page
    // cache; nothing is copied and nothing can be written back.
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw Error("cannot map '" + path + "': " + std::strerror(e));
    }
    f.map_ = p;
    f.map_size_ = size;
    f.base_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  f.size_ = size;
  try {
    f.parse();
  } catch (const Error& e) {
    throw Error("'" + path + "': " + e.what());
  }
  return f;
}

File File::from_memory(const uint8_t* data, size_t size) {
  File f;
  f.base_ = data;
  f.size_ = data ? size : 0;
  f.parse();
  return f;
}

void File::parse() {
  Cursor c(base_, size_);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic)
    throw Error("not a GGUF file: bad magic " + hex32(magic) + " (expected 'GGUF')");
  version_ = c.read<uint32_t>("version");
  if (version_ == 1)
    throw Error("GGUF version 1 is not supported (only versions 2 and 3); re-convert the model");
  if (version_ != 2 && version_ != 3) {
    std::string msg =
        "unsupported GGUF version " + std::to_string(version_) + " (only versions 2 and 3)";
    // A byte-swapped small version means a big-endian file, which ggml writes on s390x.
    if (version_ > 0xffff && (version_ & 0xffff) == 0)
      msg += "; big-endian files are not supported";
    throw Error(msg);
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each metadata entry takes at least a key length (8), a value type (4) and one value byte;
  // each tensor info at least a name length (8), n_dims (4), one dim (8), type (4), offset (8).
  if (n_kv > c.remaining() / 13)
    throw Error("metadata count " + std::to_string(n_kv) + " exceeds what the " +
                std::to_string(c.remaining()) + " bytes left in the file can hold");
  if (n_tensors > c.remaining() / 32)
    throw Error("tensor count " + std::to_string(n_tensors) + " exceeds what the " +
                std::to_string(c.remaining()) + " bytes left in the file can hold");

  std::unordered_set<std::string> keys;
  kv_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("metadata key");
    const size_t type_at = c.pos();
    const uint32_t t = c.read<uint32_t>("metadata value type");
    if (!valid_value_type(t))
      throw Error("metadata key '" + key + "' has unknown value type " + std::to_string(t) +
                  " at offset " + std::to_string(type_at));
    Value v = read_value(c, static_cast<ValueType>(t), key, 0);
    if (!keys.insert(key).second) throw Error("duplicate metadata key '" + key + "'");
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    const auto n = a->as_int();
    if (!n || *n <= 0 || (*n & (*n - 1)) != 0)
      throw Error("general.alignment must be a nonzero power of two, got " +
                  (n ? std::to_string(*n) : std::string("a non-integer value")));
    alignment_ = static_cast<uint64_t>(*n);
  } else {
    alignment_ = 32;  // GGUF's default when the key is absent
  }

  std::unordered_set<std::string> names;
  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo ti;
    ti.name = c.read_string("tensor name");
    const uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
    if (n_dims == 0) throw Error("tensor '" + ti.name + "' has zero dimensions");
    if (n_dims > kMaxDims)
      throw Error("tensor '" + ti.name + "' has " + std::to_string(n_dims) +
                  " dimensions (at most 4 supported)");
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t x = c.read<uint64_t>("tensor dimension");
      if (x == 0) throw Error("tensor '" + ti.name + "' has a zero-sized dimension");
      // ggml counts elements in int64_t.
      if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / n_el)
        throw Error("tensor '" + ti.name + "': element count overflows");
      n_el *= x;
      ti.dims.push_back(x);
    }
    const uint32_t type = c.read<uint32_t>("tensor type");
    if (!kernels::dtype_name(static_cast<kernels::DType>(type)))
      throw Error("tensor '" + ti.name + "' has " + type_label(type));
    if (!type_known(type))
      throw Error("tensor '" + ti.name + "' has type " + type_label(type) +
                  ", a layout ggml has retired; re-quantize the model");
    ti.type = static_cast<kernels::DType>(type);
    ti.offset = c.read<uint64_t>("tensor data offset");
    const auto be = static_cast<uint64_t>(kernels::dtype_block_elems(ti.type));
    if (ti.dims[0] % be != 0)
      throw Error("tensor '" + ti.name + "': inner dimension " + std::to_string(ti.dims[0]) +
                  " is not a multiple of the " + kernels::dtype_name(ti.type) + " block size " +
                  std::to_string(be));
    ti.n_elements = n_el;
    const uint64_t n_blocks = n_el / be;
    const auto bb = static_cast<uint64_t>(kernels::dtype_block_bytes(ti.type));
    if (n_blocks > std::numeric_limits<uint64_t>::max() / bb)
      throw Error("tensor '" + ti.name + "': byte size overflows");
    ti.n_bytes = n_blocks * bb;
    if (ti.offset % alignment_ != 0)
      throw Error("tensor '" + ti.name + "' offset " + std::to_string(ti.offset) +
                  " is misaligned (alignment " + std::to_string(alignment_) + ")");
    if (!names.insert(ti.name).second) throw Error("duplicate tensor name '" + ti.name + "'");
    tensors_.push_back(std::move(ti));
  }

  // The data section starts at the next multiple of the alignment. A file without tensors may
  // end right after its metadata (vocabulary-only files do).
  const size_t rem = c.pos() % alignment_;
  const uint64_t pad = rem ? alignment_ - rem : 0;
  if (tensors_.empty()) {
    data_start_ = pad <= c.remaining() ? c.pos() + pad : size_;
    return;
  }
  c.skip(pad, "padding before tensor data");
  data_start_ = c.pos();
  const uint64_t data_size = size_ - data_start_;
  for (const TensorInfo& t : tensors_) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      throw Error("tensor '" + t.name + "' (" + kernels::dtype_name(t.type) + ", offset " +
                  std::to_string(t.offset) + ", size " + std::to_string(t.n_bytes) +
                  ") lies outside the file (data section holds " + std::to_string(data_size) +
                  " bytes): the file is truncated or corrupt");
  }
}

const Value* File::find(std::string_view key) const {
  for (const auto& [k, v] : kv_)
    if (k == key) return &v;
  return nullptr;
}

std::optional<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  return v ? v->as_int() : std::nullopt;
}

std::optional<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  return v ? v->as_float() : std::nullopt;
}

std::optional<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  auto s = v->as_string();
  if (!s) return std::nullopt;
  return std::string(*s);
}

std::optional<std::vector<std::string>> File::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  const Array* a = v ? v->as_array() : nullptr;
  if (!a || a->elem_type != ValueType::STRING) return std::nullopt;
  std::vector<std::string> out;
  out.reserve(a->items.size());
  for (const Value& x : a->items) out.emplace_back(*x.as_string());
  return out;
}

std::optional<std::vector<float>> File::get_float_array(std::string_view key) const {
  const Value* v = find(key);
  const Array* a = v ? v->as_array() : nullptr;
  if (!a) return std::nullopt;
  std::vector<float> out;
  out.reserve(a->items.size());
  for (const Value& x : a->items) {
    auto f = x.as_float();
    if (!f) return std::nullopt;
    out.push_back(static_cast<float>(*f));
  }
  return out;
}

std::optional<std::vector<int64_t>> File::get_int_array(std::string_view key) const {
  const Value* v = find(key);
  const Array* a = v ? v->as_array() : nullptr;
  if (!a) return std::nullopt;
  std::vector<int64_t> out;
  out.reserve(a->items.size());
  for (const Value& x : a->items) {
    auto i = x.as_int();
    if (!i) return std::nullopt;
    out.push_back(*i);
  }
  return out;
}

const TensorInfo* File::tensor(std::string_view name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const uint8_t* File::data(const TensorInfo& t) const {
  return base_ + data_start_ + t.offset;
}

}  // namespace sy::gguf
