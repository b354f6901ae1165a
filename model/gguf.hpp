// GGUF (versions 2 and 3) reader: metadata, tensor infos and memory-mapped tensor data.
// Every malformed input raises sy::gguf::Error with a message that names the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kernels/ggml_type.hpp"

namespace sy::gguf {

/// A malformed or unsupported GGUF file; what() says what is wrong.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// GGUF metadata value types (numbering of the GGUF spec).
enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

/// Whether t is a member of kernels::DType (a type this reader can size); tensor types are
/// kernels::DType, with names and block sizes from kernels/ggml_type.hpp.
bool type_known(uint32_t t);
/// "Q6_K (14)" for a ggml type, "unknown type 99" otherwise: how errors name a type.
std::string type_label(uint32_t t);

struct Value;
/// A homogeneous array value.
struct Array {
  ValueType elem_type = ValueType::UINT8;
  std::vector<Value> items;
};

/// One metadata value. Integers of every width are stored widened; `type` keeps the file's type.
struct Value {
  ValueType type = ValueType::UINT8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<Array>> v;

  std::optional<int64_t> as_int() const;   ///< any integer type (or bool)
  std::optional<double> as_float() const;  ///< float or integer types
  std::optional<std::string_view> as_string() const;
  const Array* as_array() const;
};

/// One tensor's description; `dims[0]` is the innermost (contiguous) dimension, as in ggml.
struct TensorInfo {
  std::string name;
  std::vector<uint64_t> dims;
  kernels::DType type = kernels::DType::F32;
  uint64_t offset = 0;  ///< relative to the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
};

/// A parsed GGUF file. Tensor data points into a read-only memory mapping (or into the caller's
/// buffer for from_memory), so resident memory is what the model touches.
class File {
 public:
  /// Opens and parses a file; throws Error naming the problem.
  static File open(const std::string& path);
  /// Parses a buffer the caller keeps alive (fuzzing, tests). Throws Error.
  static File from_memory(const uint8_t* data, size_t size);

  /// Movable, not copyable: the mapping has one owner.
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  uint32_t version() const { return version_; }      ///< 2 or 3
  uint64_t alignment() const { return alignment_; }  ///< general.alignment, default 32
  /// All key/value pairs in file order (keys are unique).
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  /// The value of `key`, or nullptr.
  const Value* find(std::string_view key) const;
  /// Typed look-ups: empty when the key is absent or of another kind.
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  ///< floats and integers
  std::optional<std::string> get_string(std::string_view key) const;
  /// An array of strings (e.g. tokenizer.ggml.tokens); empty optional when absent or not strings.
  std::optional<std::vector<std::string>> get_string_array(std::string_view key) const;
  /// Arrays of numbers (integers convert to float); empty when absent or of another kind.
  std::optional<std::vector<float>> get_float_array(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;

  /// Tensor infos in file order (names are unique).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const TensorInfo* tensor(std::string_view name) const;
  /// Pointer to the tensor's bytes (checked to lie inside the file at parse time).
  const uint8_t* data(const TensorInfo& t) const;
  /// Total file size in bytes.
  size_t size() const { return size_; }

 private:
  File() = default;
  void parse();

  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<TensorInfo> tensors_;
  const uint8_t* base_ = nullptr;  // whole file
  size_t size_ = 0;
  size_t data_start_ = 0;
  void* map_ = nullptr;  // mmap'd region we own (nullptr for from_memory)
  size_t map_size_ = 0;
};

/// Writes GGUF v3 files (make-model, tests that build bad or small files).
class Writer {
 public:
  /// `alignment` must be a power of two (checked when writing); other than 32 it is recorded as
  /// general.alignment unless that key is added explicitly.
  explicit Writer(uint64_t alignment = 32) : alignment_(alignment) {}
  /// Adds a key in order. Keys are not checked for duplicates (tests write bad files on purpose).
  void add(std::string key, Value v);
  /// Typed shortcuts for add().
  void add_u32(std::string key, uint32_t x);
  void add_i32(std::string key, int32_t x);
  void add_f32(std::string key, float x);
  void add_bool(std::string key, bool x);
  void add_string(std::string key, std::string x);
  void add_string_array(std::string key, const std::vector<std::string>& xs);
  void add_f32_array(std::string key, const std::vector<float>& xs);
  void add_i32_array(std::string key, const std::vector<int32_t>& xs);
  /// dims innermost first; `bytes` must hold kernels::dtype_row_bytes(type, dims[0]) * (product
  /// of other dims).
  void add_tensor(std::string name, kernels::DType type, std::vector<uint64_t> dims,
                  std::vector<uint8_t> bytes);
  /// A tensor whose bytes are produced only while writing (large random models never sit in
  /// memory whole): `fill(dst, n_bytes)` must write exactly the tensor's bytes.
  void add_tensor(std::string name, kernels::DType type, std::vector<uint64_t> dims,
                  std::function<void(uint8_t* dst, size_t n_bytes)> fill);
  /// Serializes the whole file to bytes.
  std::vector<uint8_t> bytes() const;
  /// Writes to a path (through `path`.partial, renamed at the end); fill tensors are produced
  /// one at a time into one reused buffer. Throws std::runtime_error on I/O failure.
  void write(const std::string& path) const;

 private:
  uint64_t alignment_;
  std::vector<std::pair<std::string, Value>> kv_;
  struct PendingTensor {
    std::string name;
    kernels::DType type;
    std::vector<uint64_t> dims;
    std::vector<uint8_t> bytes;
    std::function<void(uint8_t*, size_t)> fill;  // used when bytes is empty
  };
  std::vector<PendingTensor> tensors_;
};

}  // namespace sy::gguf
