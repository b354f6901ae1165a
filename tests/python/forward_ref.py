"""An independent float64 numpy forward pass of a small GGUF model (architectures llama with
rope_freqs, qwen2, qwen3) with F32/F16 weights, the oracle of tests/unit/test_engine_archs.cpp.

Usage: forward_ref.py MODEL.gguf ID [ID ...]
Prints the logits of every position, one line of space-separated numbers per token.
"""
import sys

import numpy as np

import gguf_min


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, theta, n_rot, neox, factors):
    """x: (T, heads, head_dim); rotates the first n_rot dims of every head. factors: None or
    (n_rot / 2) divisors of the pairs' frequencies (rope_freqs.weight)."""
    half = n_rot // 2
    freq = theta ** (-2.0 * np.arange(half) / n_rot)
    if factors is not None:
        freq = freq / factors
    ang = pos[:, None] * freq[None, :]
    c = np.cos(ang)[:, None, :]
    s = np.sin(ang)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half] = a * c - b * s
        out[..., half:n_rot] = a * s + b * c
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * c - b * s
        out[..., 1:n_rot:2] = a * s + b * c
    return out


def forward(g, ids):
    arch = g.meta["general.architecture"]
    if arch not in ("llama", "qwen2", "qwen3"):
        raise SystemExit("forward_ref.py: architecture %s is not implemented here" % arch)
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
    neox = arch != "llama"

    def t(name):
        return g.tensor(name).astype(np.float64)

    def opt(name):
        return t(name) if name in g.tensors else None

    ids = np.asarray(ids)
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = t("token_embd.weight")[ids]
    factors = opt("rope_freqs.weight")
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    for l in range(n_layers):
        b = "blk.%d." % l
        h = rmsnorm(x, t(b + "attn_norm.weight"), eps)
        q = h @ t(b + "attn_q.weight").T
        k = h @ t(b + "attn_k.weight").T
        v = h @ t(b + "attn_v.weight").T
        for y, name in ((q, "attn_q.bias"), (k, "attn_k.bias"), (v, "attn_v.bias")):
            bias = opt(b + name)
            if bias is not None:
                y += bias
        q = q.reshape(T, n_heads, hd)
        k = k.reshape(T, n_kv, hd)
        v = v.reshape(T, n_kv, hd)
        qn, kn = opt(b + "attn_q_norm.weight"), opt(b + "attn_k_norm.weight")
        if qn is not None:
            q = rmsnorm(q, qn, eps)
        if kn is not None:
            k = rmsnorm(k, kn, eps)
        q = rope(q, pos, theta, n_rot, neox, factors)
        k = rope(k, pos, theta, n_rot, neox, factors)
        out = np.zeros((T, n_heads, hd))
        group = n_heads // n_kv
        for hh in range(n_heads):
            kh, vh = k[:, hh // group, :], v[:, hh // group, :]
            sc = q[:, hh, :] @ kh.T / np.sqrt(hd) + mask
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            sc /= sc.sum(axis=1, keepdims=True)
            out[:, hh, :] = sc @ vh
        o = out.reshape(T, n_heads * hd) @ t(b + "attn_output.weight").T
        bo = opt(b + "attn_output.bias")
        x = x + (o if bo is None else o + bo)
        h = rmsnorm(x, t(b + "ffn_norm.weight"), eps)
        gate = h @ t(b + "ffn_gate.weight").T
        up = h @ t(b + "ffn_up.weight").T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ t(b + "ffn_down.weight").T
    w_out = opt("output.weight")
    if w_out is None:
        w_out = t("token_embd.weight")
    return rmsnorm(x, t("output_norm.weight"), eps) @ w_out.T


def main():
    g = gguf_min.GGUF(sys.argv[1])
    logits = forward(g, [int(a) for a in sys.argv[2:]])
    for row in logits:
        print(" ".join("%.9g" % v for v in row))


if __name__ == "__main__":
    main()
