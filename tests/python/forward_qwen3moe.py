"""An independent float64 numpy forward pass of a small `qwen3moe` GGUF model with F32/F16
weights, the oracle of tests/unit/test_engine_archs.cpp for that architecture.

qwen3's attention (per-head RMSNorm of queries and keys before NEOX RoPE, no biases) and a
mixture of experts for every feed-forward, as llama.cpp's llm_build_qwen3moe: router logits
ffn_gate_inp . x, a softmax over all experts, the expert_used_count most probable ones (ties to
the lower index), their probabilities divided by their sum (qwen3moe.expert_weights_norm, default
true), times qwen3moe.expert_weights_scale (default 1); expert e computes
ffn_down_exps[e] . (silu(ffn_gate_exps[e] . x) * (ffn_up_exps[e] . x)) and the weighted outputs
are summed onto the residual.

Usage: forward_qwen3moe.py MODEL.gguf ID [ID ...]
Prints the logits of every position, one line of space-separated numbers per token, then the line
`router_gap G`: the smallest gap, over every token and layer, between the k-th and the (k+1)-th
largest router logit (k = expert_used_count). A runtime in f32 picks the same experts as this
float64 pass wherever that gap is well above its rounding of the router logits.
"""
import sys

import numpy as np

import gguf_min
from forward_ref import rmsnorm, rope


def moe(h, router, gate, up, down, n_used, norm_w, scale):
    """h: (T, dim); router (E, dim); gate, up (E, F, dim); down (E, dim, F). Returns the FFN
    output (T, dim) and the smallest k-th/(k+1)-th router logit gap of these tokens."""
    logits = h @ router.T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out = np.zeros_like(h)
    gap = np.inf
    for t in range(h.shape[0]):
        order = np.argsort(-p[t], kind="stable")
        chosen = order[:n_used]
        if n_used < len(order):
            gap = min(gap, logits[t, order[n_used - 1]] - logits[t, order[n_used]])
        w = p[t, chosen]
        if norm_w:
            w = w / w.sum()
        w = w * scale
        for e, we in zip(chosen, w):
            g = gate[e] @ h[t]
            u = up[e] @ h[t]
            out[t] += we * (down[e] @ (g / (1.0 + np.exp(-g)) * u))
    return out, gap


def forward(g, ids):
    arch = g.meta["general.architecture"]
    if arch != "qwen3moe":
        raise SystemExit("forward_qwen3moe.py: architecture %s is not qwen3moe" % arch)
    p = arch + "."
    m = g.meta
    dim = m[p + "embedding_length"]
    n_layers = m[p + "block_count"]
    n_heads = m[p + "attention.head_count"]
    n_kv = m.get(p + "attention.head_count_kv", n_heads)
    hd = m.get(p + "attention.key_length", dim // n_heads)
    n_rot = m.get(p + "rope.dimension_count", hd)
    theta = m.get(p + "rope.freq_base", 10000.0)
    eps = m.get(p + "attention.layer_norm_rms_epsilon", 1e-5)
    n_used = m[p + "expert_used_count"]
    norm_w = m.get(p + "expert_weights_norm", True)
    scale = m.get(p + "expert_weights_scale", 1.0)
    if m.get(p + "expert_gating_func", 1) != 1:
        raise SystemExit("forward_qwen3moe.py: only softmax gating (expert_gating_func 1)")

    def t(name):
        return g.tensor(name).astype(np.float64)

    ids = np.asarray(ids)
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = t("token_embd.weight")[ids]
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    gap = np.inf
    for l in range(n_layers):
        b = "blk.%d." % l
        h = rmsnorm(x, t(b + "attn_norm.weight"), eps)
        q = (h @ t(b + "attn_q.weight").T).reshape(T, n_heads, hd)
        k = (h @ t(b + "attn_k.weight").T).reshape(T, n_kv, hd)
        v = (h @ t(b + "attn_v.weight").T).reshape(T, n_kv, hd)
        q = rope(rmsnorm(q, t(b + "attn_q_norm.weight"), eps), pos, theta, n_rot, True, None)
        k = rope(rmsnorm(k, t(b + "attn_k_norm.weight"), eps), pos, theta, n_rot, True, None)
        out = np.zeros((T, n_heads, hd))
        group = n_heads // n_kv
        for hh in range(n_heads):
            kh, vh = k[:, hh // group, :], v[:, hh // group, :]
            sc = q[:, hh, :] @ kh.T / np.sqrt(hd) + mask
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            sc /= sc.sum(axis=1, keepdims=True)
            out[:, hh, :] = sc @ vh
        x = x + out.reshape(T, n_heads * hd) @ t(b + "attn_output.weight").T
        h = rmsnorm(x, t(b + "ffn_norm.weight"), eps)
        f, lgap = moe(h, t(b + "ffn_gate_inp.weight"), t(b + "ffn_gate_exps.weight"),
                      t(b + "ffn_up_exps.weight"), t(b + "ffn_down_exps.weight"), n_used,
                      norm_w, scale)
        x = x + f
        gap = min(gap, lgap)
    w_out = t("output.weight") if "output.weight" in g.tensors else t("token_embd.weight")
    return rmsnorm(x, t("output_norm.weight"), eps) @ w_out.T, gap


def main():
    g = gguf_min.GGUF(sys.argv[1])
    logits, gap = forward(g, [int(a) for a in sys.argv[2:]])
    for row in logits:
        print(" ".join("%.9g" % v for v in row))
    print("router_gap %.9g" % gap)


if __name__ == "__main__":
    main()
