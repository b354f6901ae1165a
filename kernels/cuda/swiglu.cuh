// The gated activation of the fused gate/up projection: SwiGLU, or GELU(tanh)-GLU (gemma2).
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// The activation applied to the gate.
enum class GateAct {
  SiLU,      ///< silu(g) = g / (1 + exp(-g))
  GeluTanh,  ///< 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3)))
};

/// gu is f32 (n_rows, 2 * ffn): gate in columns [0, ffn), up in [ffn, 2 * ffn).
/// out[r, i] = act(gate[r, i]) * up[r, i], out is (n_rows, ffn) of T.
template <class T>
cudaError_t swiglu(const float* gu, int n_rows, int ffn, T* out, cudaStream_t stream,
                   GateAct act = GateAct::SiLU);

}  // namespace sy::cuda
