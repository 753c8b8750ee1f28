#!/usr/bin/env python3
"""Float reference for qforge's Llama-family models (framework/models/llama.h), in plain PyTorch.

Written from the facts of Hugging Face's LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM
and their config classes (per-model_type defaults, transformers 5's rope_parameters, Qwen2's
window only with use_sliding_window, Mistral's on every layer; see resolve_config) (RMSNorm in float32, rotate-half RoPE with the "linear" and "llama3" rope_scaling kinds,
grouped-query attention by repeating key/value heads, an additive float32-min causal mask (with
a sliding window: position q sees keys k with q - window < k <= q),
softmax in float32, SwiGLU MLP, tied or untied head). It does not import transformers.

  llama_reference.py --write DIR   builds the tiny random models below as HF folders under DIR
                                   (config.json, weights, reference_logits.safetensors) and
                                   DIR/perplexity_reference.json (HF's perplexity-guide loop)
  llama_reference.py --check DIR   recomputes every folder's logits from its own files and
                                   compares them with the stored ones (exit 77 without torch)
"""
import argparse
import json
import math
import os
import struct
import sys

try:
    import torch
except ImportError:  # the ctest wrapper reports this as skipped
    print("python3-torch is not installed: skipping the Llama reference check")
    sys.exit(77)

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}
NAMES = {v: k for k, v in DTYPES.items()}

# Tiny configurations: every kind of RoPE scaling, GQA and MHA, biases, tied and untied heads,
# an explicit head_dim, sliding windows shorter than the sequence (Mistral on every layer, Qwen2
# on the second), and the three stored dtypes (one of them sharded); then a transformers-5 config
# (rope_parameters), a Mistral config leaning on MistralConfig's defaults (and an attention_bias
# Mistral ignores), and Qwen2 layer_types marking a window that use_sliding_window turns off.
CASES = {
    "llama3_gqa_tied_bf16_sharded": dict(
        config=dict(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                    rope_theta=10000.0, tie_word_embeddings=True, hidden_act="silu",
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=64)),
        dtype=torch.bfloat16, shards=2),
    "llama2_biases_untied_f32": dict(
        config=dict(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128, rms_norm_eps=1e-6,
                    rope_theta=10000.0, tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
                    hidden_act="silu", rope_scaling=None),
        dtype=torch.float32, shards=1),
    "qwen2_gqa_tied_window_f16": dict(
        config=dict(model_type="qwen2", vocab_size=80, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128, rms_norm_eps=1e-6,
                    rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=True,
                    sliding_window=4, max_window_layers=1, hidden_act="silu"),
        dtype=torch.float16, shards=1),
    "mistral_window_head_dim_linear_rope_untied_f32": dict(
        config=dict(model_type="mistral", vocab_size=72, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=128,
                    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, sliding_window=3,
                    hidden_act="silu", rope_scaling=dict(rope_type="linear", factor=2.0)),
        dtype=torch.float32, shards=1),
    "llama3_rope_parameters_tf5_f32": dict(
        config=dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                    tie_word_embeddings=False, hidden_act="silu", transformers_version="5.0.0",
                    rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0, original_max_position_embeddings=64)),
        dtype=torch.float32, shards=1),
    "mistral_defaults_omitted_f32": dict(
        config=dict(model_type="mistral", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=16, attention_bias=True),
        dtype=torch.float32, shards=1),
    "qwen2_layer_types_window_off_f32": dict(
        config=dict(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, use_sliding_window=False, sliding_window=3,
                    layer_types=["sliding_attention", "sliding_attention"], tie_word_embeddings=True),
        dtype=torch.float32, shards=1),
}
BATCH, SEQ = 2, 10
# Cached decoding: a 2-token prompt, a 5-token chunk after it (longer than the fixtures' windows),
# then one token at a time.
CHUNKS = (2, 5)

# HF's config-class defaults for the keys the forward reads (LlamaConfig, MistralConfig, Qwen2Config).
_COMMON = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=None, head_dim=None, max_position_embeddings=2048,
               rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, rope_parameters=None,
               tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
DEFAULTS = {
    "llama": dict(_COMMON),
    "mistral": dict(_COMMON, intermediate_size=14336, num_key_value_heads=8, max_position_embeddings=4096 * 32,
                    sliding_window=4096),
    "qwen2": dict(_COMMON, vocab_size=151936, intermediate_size=22016, num_key_value_heads=32,
                  max_position_embeddings=32768, use_sliding_window=False, sliding_window=4096, max_window_layers=28,
                  layer_types=None),
}


# ---- safetensors, read and written here so the script needs nothing beyond torch ----
def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        dtype = DTYPES[info["dtype"]]
        if dtype in (torch.bfloat16, torch.float16):
            t = torch.frombuffer(raw, dtype=torch.int16).view(dtype)
        else:
            t = torch.frombuffer(raw, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def read_folder_weights(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(folder, "model.safetensors"))
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(weight_map.values())):
        out.update(read_safetensors(os.path.join(folder, shard)))
    return out


# ---- the model, as plain functions over a name -> float32 tensor map ----
def resolve_config(raw):
    """The configuration HF's config class makes of config.json's `raw` (explicit nulls stay None)."""
    kind = raw.get("model_type", "llama")
    c = dict(DEFAULTS[kind], **raw)
    L = c["num_hidden_layers"]
    if c["num_key_value_heads"] is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if c["head_dim"] is None:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    # transformers 5 holds rope_theta and the scaling in rope_parameters; older configs at the top level.
    rope = dict(c["rope_scaling"] or c["rope_parameters"] or {})
    c["rope_theta"] = rope.get("rope_theta", c["rope_theta"])
    c["rope"] = dict(rope, rope_type=rope.get("rope_type", rope.get("type", "default")))
    if kind == "qwen2":
        if not c["use_sliding_window"]:
            c["sliding_window"] = None
        types = c["layer_types"] or ["sliding_attention" if c["sliding_window"] is not None and i >= c["max_window_layers"]
                                     else "full_attention" for i in range(L)]
        c["windows"] = [c["sliding_window"] if t == "sliding_attention" else None for t in types]
    else:  # Mistral's attention windows every layer; Llama's none
        c["windows"] = [c.get("sliding_window") if kind == "mistral" else None] * L
    # Mistral and Qwen2 ignore attention_bias and mlp_bias; Qwen2 always has q/k/v biases.
    llama = kind == "llama"
    c["qkv_bias"] = kind == "qwen2" or (llama and c["attention_bias"])
    c["o_bias"] = llama and c["attention_bias"]
    c["mlp_biases"] = llama and c["mlp_bias"]
    return c


def head_dim(c):
    return c["head_dim"]


def kv_heads(c):
    return c["num_key_value_heads"]


def rope_inv_freq(c):
    d = head_dim(c)
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = c["rope"]
    kind = s["rope_type"]
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / s["factor"]
    assert kind == "llama3", kind
    factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = old / low, old / high
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended linearly
    # in old / wavelen.
    out = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    blend = (old / wavelen - low) / (high - low)
    blended = (1 - blend) * out / factor + blend * out
    in_band = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(in_band, blended, out)


def rms_norm(x, weight, eps):
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    swapped = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + swapped * sin


def linear(w, name, x):
    return torch.nn.functional.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def attention(c, w, p, x, cos, sin, cache, window):
    B, T, _ = x.shape
    H, KV, D = c["num_attention_heads"], kv_heads(c), head_dim(c)
    q = linear(w, p + "q_proj", x).view(B, T, H, D).transpose(1, 2)
    k = linear(w, p + "k_proj", x).view(B, T, KV, D).transpose(1, 2)
    v = linear(w, p + "v_proj", x).view(B, T, KV, D).transpose(1, 2)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    if cache is not None:
        if p in cache:
            k = torch.cat([cache[p][0], k], dim=2)
            v = torch.cat([cache[p][1], v], dim=2)
        cache[p] = (k, v)
    S = k.shape[2]
    # Each key/value head repeated for the query heads that share it.
    k_all = k.repeat_interleave(H // KV, dim=1)
    v_all = v.repeat_interleave(H // KV, dim=1)
    scores = torch.matmul(q, k_all.transpose(2, 3)) * D ** -0.5
    q_pos, k_pos = torch.arange(S - T, S)[:, None], torch.arange(S)[None, :]
    visible = k_pos <= q_pos
    if window:
        visible &= k_pos > q_pos - window
    scores = scores + torch.zeros(T, S).masked_fill(~visible, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, v_all).transpose(1, 2).reshape(B, T, H * D)
    return linear(w, p + "o_proj", out)


def forward(c, w, ids, cache=None, past=0):
    T = ids.shape[1]
    inv_freq = rope_inv_freq(c)
    angles = torch.arange(past, past + T).float()[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    eps = c["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(c, w, p + "self_attn.", rms_norm(x, w[p + "input_layernorm.weight"], eps), cos, sin, cache,
                          c["windows"][i])
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(linear(w, p + "mlp.gate_proj", h))
        x = x + linear(w, p + "mlp.down_proj", gate * linear(w, p + "mlp.up_proj", h))
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return torch.nn.functional.linear(x, head)


def decoded_logits(c, w, ids):
    """The logits of cached decoding in CHUNKS, then one token at a time."""
    cache, rows, t = {}, [], 0
    for n in CHUNKS + (1,) * (ids.shape[1] - sum(CHUNKS)):
        rows.append(forward(c, w, ids[:, t:t + n], cache, t))
        t += n
    return torch.cat(rows, dim=1)


# The perplexity oracle: one fixture, a token sequence, windows (max_length, stride) with the
# stride shorter than, equal to and far below the window.
PERPLEXITY_FIXTURE, PERPLEXITY_TOKENS, PERPLEXITY_RUNS = "llama2_biases_untied_f32", 30, ((8, 3), (8, 8), (5, 1))


def guide_perplexity(c, w, ids, max_length, stride):
    """Perplexity as HF's perplexity guide computes it: windows of max_length every stride, the
    context's labels set to -100, CrossEntropyLoss over the shifted labels. Each window's mean loss
    is weighted by the labels it actually scores (the guide's `- batch_size` count is one short on
    every window after the first)."""
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)
    n, nll_sum, scored, prev_end = ids.shape[1], 0.0, 0, 0
    for begin in range(0, n, stride):
        end = min(begin + max_length, n)
        trg_len = end - prev_end
        input_ids = ids[:, begin:end]
        labels = input_ids.clone()
        labels[:, :-trg_len] = -100
        logits = forward(c, w, input_ids)
        shift_logits, shift_labels = logits[:, :-1, :].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
        counted = int((shift_labels != -100).sum())
        if counted:
            nll_sum += loss_fn(shift_logits.double(), shift_labels).item() * counted
        scored += counted
        prev_end = end
        if end == n:
            break
    return math.exp(nll_sum / scored), scored


def perplexity_runs(root, tokens):
    folder = os.path.join(root, PERPLEXITY_FIXTURE)
    with open(os.path.join(folder, "config.json")) as f:
        c = resolve_config(json.load(f))
    w = {k: v.float() for k, v in read_folder_weights(folder).items()}
    ids = torch.tensor([tokens])
    out = []
    with torch.no_grad():
        for max_length, stride in PERPLEXITY_RUNS:
            ppl, scored = guide_perplexity(c, w, ids, max_length, stride)
            out.append(dict(max_length=max_length, stride=stride, perplexity=ppl, tokens_scored=scored))
    return out


def write_perplexity(root):
    c = resolve_config(CASES[PERPLEXITY_FIXTURE]["config"])
    gen = torch.Generator().manual_seed(77)
    tokens = torch.randint(0, c["vocab_size"], (PERPLEXITY_TOKENS,), generator=gen).tolist()
    ref = dict(fixture=PERPLEXITY_FIXTURE, tokens=tokens, runs=perplexity_runs(root, tokens))
    with open(os.path.join(root, "perplexity_reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print("perplexity_reference.json:", [round(r["perplexity"], 4) for r in ref["runs"]])


def check_perplexity(root):
    with open(os.path.join(root, "perplexity_reference.json")) as f:
        ref = json.load(f)
    runs = perplexity_runs(root, ref["tokens"])
    err = max(abs(a["perplexity"] - b["perplexity"]) / b["perplexity"] for a, b in zip(runs, ref["runs"]))
    same = all(a["tokens_scored"] == b["tokens_scored"] for a, b in zip(runs, ref["runs"]))
    print(f"perplexity_reference.json: reproduced within {err:.1e}")
    return err < CROSS_MACHINE and same and len(runs) == len(ref["runs"])


def relative_error(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


# ---- fixtures ----
# How close --check must come to what --write stored: float32 logits (and perplexities) recomputed on
# another CPU differ in their last bits (the GEMM kernels, and their summation order, follow the CPU;
# seen: up to 1.3e-6 on an AMD EPYC for fixtures written on another machine): the bound is ten times
# that, still float32 noise beside the error of any formula mistake.
CROSS_MACHINE = 1e-5

def random_weights(c, gen):
    H, KV, D, h, f = c["num_attention_heads"], kv_heads(c), head_dim(c), c["hidden_size"], c["intermediate_size"]
    qkv_bias, o_bias, mlp_bias = c["qkv_bias"], c["o_bias"], c["mlp_biases"]
    shapes = {"model.embed_tokens.weight": ([c["vocab_size"], h], 1.0), "model.norm.weight": ([h], None)}
    if not c.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = ([c["vocab_size"], h], 0.2)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, out, inp, bias in [("self_attn.q_proj", H * D, h, qkv_bias), ("self_attn.k_proj", KV * D, h, qkv_bias),
                                     ("self_attn.v_proj", KV * D, h, qkv_bias), ("self_attn.o_proj", h, H * D, o_bias),
                                     ("mlp.gate_proj", f, h, mlp_bias), ("mlp.up_proj", f, h, mlp_bias),
                                     ("mlp.down_proj", h, f, mlp_bias)]:
            shapes[p + name + ".weight"] = ([out, inp], 0.3)
            if bias:
                shapes[p + name + ".bias"] = ([out], 0.1)
        shapes[p + "input_layernorm.weight"] = ([h], None)
        shapes[p + "post_attention_layernorm.weight"] = ([h], None)
    out = {}
    for name, (shape, std) in shapes.items():
        # Norm weights near 1, so a missing weight multiply shows.
        t = 1 + 0.2 * torch.randn(shape, generator=gen) if std is None else std * torch.randn(shape, generator=gen)
        out[name] = t
    return out


def write_weights(folder, weights, shards):
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), weights, {"format": "pt"})
        return
    names = sorted(weights)
    weight_map = {}
    for s in range(shards):
        part = {n: weights[n] for n in names[s::shards]}
        shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(folder, shard), part, {"format": "pt"})
        weight_map.update({n: shard for n in part})
    total = sum(t.numel() * t.element_size() for t in weights.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def write_case(root, name, case, seed):
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    raw = dict(case["config"], architectures=[{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                                                "qwen2": "Qwen2ForCausalLM"}[case["config"]["model_type"]]])
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
    c = resolve_config(raw)
    gen = torch.Generator().manual_seed(seed)
    stored = {k: v.to(case["dtype"]) for k, v in random_weights(c, gen).items()}
    write_weights(folder, stored, case["shards"])
    # The reference runs on the stored values, widened to float32 as qforge reads them.
    w = {k: v.float() for k, v in stored.items()}
    ids = torch.randint(0, c["vocab_size"], (BATCH, SEQ), generator=gen)
    with torch.no_grad():
        logits = forward(c, w, ids)
        err = relative_error(decoded_logits(c, w, ids), logits)
    assert err < 1e-6, f"{name}: cached decoding differs from the full forward by {err}"
    write_safetensors(os.path.join(folder, "reference_logits.safetensors"), {"input_ids": ids, "logits": logits})
    print(f"{name}: logits {list(logits.shape)}, cached decoding within {err:.1e}")


def check_case(folder):
    with open(os.path.join(folder, "config.json")) as f:
        c = resolve_config(json.load(f))
    w = {k: v.float() for k, v in read_folder_weights(folder).items()}
    ref = read_safetensors(os.path.join(folder, "reference_logits.safetensors"))
    with torch.no_grad():
        full = forward(c, w, ref["input_ids"])
        decoded = decoded_logits(c, w, ref["input_ids"])
    err = max(relative_error(full, ref["logits"]), relative_error(decoded, ref["logits"]))
    print(f"{os.path.basename(folder)}: stored logits reproduced within {err:.1e}")
    return err < CROSS_MACHINE


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="DIR")
    mode.add_argument("--check", metavar="DIR")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.write:
        for seed, (name, case) in enumerate(CASES.items()):
            write_case(args.write, name, case, 1000 + seed)
        write_perplexity(args.write)
        return 0
    ok = all([check_case(os.path.join(args.check, name)) for name in CASES] + [check_perplexity(args.check)])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
