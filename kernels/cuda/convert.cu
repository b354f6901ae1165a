// Conversion kernels: one thread per output element (grid-stride), each reading its own source
// element (and its group's scales for quantized types, decoded by dequant_blocks.cuh), so that a
// warp's stores are contiguous.
#include <algorithm>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/dequant_blocks.cuh"

namespace sy::cuda {
namespace {

constexpr int kQK = 32;       // elements per Q8_0 block
constexpr int kQ8Bytes = 34;  // f16 scale + 32 int8
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // grid-stride beyond this: plenty to fill the device

__device__ float f16_bits(const uint8_t* p) {
  const unsigned short h = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(h));
}

// F32, F16 and BF16 elements.
template <class T>
__global__ void convert_kernel(kernels::DType type, const uint8_t* src, int64_t n, T* dst) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    float v = 0.0f;
    if (type == kernels::DType::F32) {
      v = reinterpret_cast<const float*>(src)[k];
    } else if (type == kernels::DType::F16) {
      v = f16_bits(src + 2 * k);
    } else {
      const unsigned short b = static_cast<unsigned short>(src[2 * k] | (src[2 * k + 1] << 8));
      v = __uint_as_float(static_cast<unsigned>(b) << 16);
    }
    dst[k] = dev::from_f<T>(v);
  }
}

// Elements of a quantized type Q (a decoder of dequant_blocks.cuh); rows hold whole blocks.
template <class Q, class T>
__global__ void dequant_kernel(const uint8_t* src, int64_t n, int64_t cols, T* dst) {
  const int64_t blocks_per_row = cols / Q::kElems;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = k / cols, c = k % cols;
    const uint8_t* blk = src + (r * blocks_per_row + c / Q::kElems) * Q::kBytes;
    const int e = static_cast<int>(c % Q::kElems);
    float mul, add;
    Q::group(blk, e / Q::kGroup, mul, add);
    dst[k] = dev::from_f<T>(dq::value(mul, Q::code(blk, e), add));
  }
}

__device__ inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
__global__ void fill_kernel(T* dst, int64_t n, float offset, float scale, uint64_t seed) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const float u = static_cast<float>(mix64(seed ^ mix64(static_cast<uint64_t>(k))) >> 40) *
                        (2.0f / 16777216.0f) -
                    1.0f;
    dst[k] = dev::from_f<T>(offset + scale * u);
  }
}

// One thread per 16-bit word of the Q8_0 blocks (17 per block: the scale, then 16 pairs of
// int8), so a warp's stores are contiguous. Quants are uniform over [-127, 127] and the scale is
// the same for every block, scale / 127: the dequantized values are spread as fill_kernel's.
__global__ void fill_q8_0_kernel(unsigned short* dst, int64_t n_words, float scale, uint64_t seed) {
  constexpr int kWords = kQ8Bytes / 2;
  const unsigned short d = __half_as_ushort(__float2half(scale / 127.0f));
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n_words;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t blk = k / kWords;
    const int w = static_cast<int>(k % kWords);
    if (w == 0) {
      dst[k] = d;
      continue;
    }
    // The block's elements are elements blk * 32 ... of the matrix (rows hold whole blocks).
    const int64_t e = blk * kQK + 2 * (w - 1);
    unsigned short pair = 0;
    for (int i = 0; i < 2; ++i) {
      const uint64_t u = mix64(seed ^ mix64(static_cast<uint64_t>(e + i))) >> 40;  // 24 bits
      const int q = static_cast<int>((u * 255) >> 24) - 127;
      pair |= static_cast<unsigned short>((static_cast<unsigned>(q) & 0xffu) << (8 * i));
    }
    dst[k] = pair;
  }
}

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

template <class Q, class T>
cudaError_t launch_dequant(const void* src, int64_t n, int64_t cols, T* dst, cudaStream_t stream) {
  dequant_kernel<Q, T>
      <<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const uint8_t*>(src), n, cols, dst);
  return cudaGetLastError();
}

}  // namespace

template <class T>
cudaError_t convert_rows(kernels::DType type, const void* src, int64_t n_rows, int64_t cols, T* dst,
                         cudaStream_t stream) {
  if (!convert_supports(type) || cols % kernels::dtype_block_elems(type) != 0)
    return cudaErrorInvalidValue;
  const int64_t n = n_rows * cols;
  if (n <= 0) return cudaSuccess;
  switch (type) {
    case kernels::DType::F32:
    case kernels::DType::F16:
    case kernels::DType::BF16:
      convert_kernel<T>
          <<<blocks_for(n), kThreads, 0, stream>>>(type, static_cast<const uint8_t*>(src), n, dst);
      return cudaGetLastError();
    case kernels::DType::Q8_0:
      return launch_dequant<dq::Q8_0>(src, n, cols, dst, stream);
    case kernels::DType::Q4_0:
      return launch_dequant<dq::Q4_0>(src, n, cols, dst, stream);
    case kernels::DType::Q4_1:
      return launch_dequant<dq::Q4_1>(src, n, cols, dst, stream);
    case kernels::DType::Q5_0:
      return launch_dequant<dq::Q5_0>(src, n, cols, dst, stream);
    case kernels::DType::Q5_1:
      return launch_dequant<dq::Q5_1>(src, n, cols, dst, stream);
    case kernels::DType::IQ4_NL:
      return launch_dequant<dq::IQ4_NL>(src, n, cols, dst, stream);
    case kernels::DType::Q2_K:
      return launch_dequant<dq::Q2_K>(src, n, cols, dst, stream);
    case kernels::DType::Q3_K:
      return launch_dequant<dq::Q3_K>(src, n, cols, dst, stream);
    case kernels::DType::Q4_K:
      return launch_dequant<dq::Q4_K>(src, n, cols, dst, stream);
    case kernels::DType::Q5_K:
      return launch_dequant<dq::Q5_K>(src, n, cols, dst, stream);
    case kernels::DType::Q6_K:
      return launch_dequant<dq::Q6_K>(src, n, cols, dst, stream);
    case kernels::DType::IQ4_XS:
      return launch_dequant<dq::IQ4_XS>(src, n, cols, dst, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <class T>
cudaError_t fill_uniform(T* dst, int64_t n, float offset, float scale, uint64_t seed,
                         cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  fill_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(dst, n, offset, scale, seed);
  return cudaGetLastError();
}

cudaError_t fill_q8_0(void* dst, int64_t rows, int64_t cols, float scale, uint64_t seed,
                      cudaStream_t stream) {
  if (cols % kQK != 0) return cudaErrorInvalidValue;
  const int64_t n_words = rows * (cols / kQK) * (kQ8Bytes / 2);
  if (n_words <= 0) return cudaSuccess;
  fill_q8_0_kernel<<<blocks_for(n_words), kThreads, 0, stream>>>(static_cast<unsigned short*>(dst),
                                                                 n_words, scale, seed);
  return cudaGetLastError();
}

template cudaError_t convert_rows<float>(kernels::DType, const void*, int64_t, int64_t, float*,
                                         cudaStream_t);
template cudaError_t convert_rows<bf16>(kernels::DType, const void*, int64_t, int64_t, bf16*,
                                        cudaStream_t);
template cudaError_t fill_uniform<float>(float*, int64_t, float, float, uint64_t, cudaStream_t);
template cudaError_t fill_uniform<bf16>(bf16*, int64_t, float, float, uint64_t, cudaStream_t);
template cudaError_t fill_uniform<half>(half*, int64_t, float, float, uint64_t, cudaStream_t);

}  // namespace sy::cuda
