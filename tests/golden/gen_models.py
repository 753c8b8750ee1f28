"""Golden logits for the reference models (framework/models/): MLP, CNN, BERT, GPT-2.

Each model is rebuilt here in plain PyTorch with the module structure and parameter names of the
Hugging Face classes (BertForSequenceClassification, GPT2LMHeadModel; transformers is not needed,
the code follows transformers' modeling_bert.py / modeling_gpt2.py), given small seeded weights,
and run on fixed inputs. Weights go to tests/golden/models_<name>.safetensors, written by a
minimal safetensors writer below (HF layout: GPT-2 Conv1D weights stored [in, out]); configs,
inputs and outputs go to tests/golden/models.json. The C++ test loads the weights through
qforge's safetensors reader and HF-name import and must match within 1e-5.
"""
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

from golden_util import HERE, tensor_json, write

torch.manual_seed(0)
FMIN = torch.finfo(torch.float32).min


def write_safetensors(path, tensors, metadata=None):
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous().to(torch.float32)
        b = t.numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def randomize(model, scale=0.2):
    """Seeded weights big enough that every layer matters (HF's 0.02 init would hide bugs)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or ".ln_" in name or "ln_f" in name or name.endswith(".bn.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p)) if name.endswith("weight") else p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))


# ---- BERT (transformers/models/bert/modeling_bert.py, absolute positions, eval mode) --------

class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"], padding_idx=c["pad_token_id"])
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], c["hidden_size"])
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])

    def forward(self, ids, tt):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        e = self.word_embeddings(ids) + self.token_type_embeddings(tt) + self.position_embeddings(pos)
        return self.dropout(self.LayerNorm(e))


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.d = c["num_attention_heads"], c["hidden_size"] // c["num_attention_heads"]
        self.query = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.key = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.value = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.dropout = nn.Dropout(c["attention_probs_dropout_prob"])

    def split(self, x):
        return x.view(x.shape[0], x.shape[1], self.h, self.d).permute(0, 2, 1, 3)

    def forward(self, x, mask):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d) + mask
        p = self.dropout(F.softmax(s, dim=-1))
        ctx = torch.matmul(p, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(ctx.shape[0], ctx.shape[1], -1)


class BertResidual(nn.Module):  # BertSelfOutput and BertOutput
    def __init__(self, c, n_in):
        super().__init__()
        self.dense = nn.Linear(n_in, c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])

    def forward(self, x, res):
        return self.LayerNorm(self.dropout(self.dense(x)) + res)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertResidual(c, c["hidden_size"])

    def forward(self, x, mask):
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])

    def forward(self, x):
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertResidual(c, c["intermediate_size"])

    def forward(self, x, mask):
        a = self.attention(x, mask)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c["num_hidden_layers"])])

    def forward(self, x, mask):
        for l in self.layer:
            x = l(x, mask)
        return x


class BertPooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"])

    def forward(self, h):
        return torch.tanh(self.dense(h[:, 0]))


class BertModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        self.pooler = BertPooler(c)

    def forward(self, ids, attention_mask, tt):
        ext = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * FMIN
        h = self.encoder(self.embeddings(ids, tt), ext)
        return h, self.pooler(h)


class BertForSequenceClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c)
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])
        self.classifier = nn.Linear(c["hidden_size"], c["num_labels"])

    def forward(self, ids, attention_mask, tt):
        h, pooled = self.bert(ids, attention_mask, tt)
        return self.classifier(self.dropout(pooled)), h, pooled


# ---- GPT-2 (transformers/models/gpt2/modeling_gpt2.py) ------------------------------------

class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))  # [in, out], as HF stores it
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.e, self.h = c["n_embd"], c["n_head"]
        self.c_attn = Conv1D(3 * self.e, self.e)
        self.c_proj = Conv1D(self.e, self.e)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split(self.e, dim=2)
        sh = lambda t: t.view(B, T, self.h, self.e // self.h).permute(0, 2, 1, 3)
        q, k, v = sh(q), sh(k), sh(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        w = torch.where(causal, w, torch.tensor(FMIN))
        a = torch.matmul(F.softmax(w, dim=-1), v).permute(0, 2, 1, 3).reshape(B, T, self.e)
        return self.c_proj(a)


class GPT2MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        inner = c["n_inner"] or 4 * c["n_embd"]
        self.c_fc = Conv1D(inner, c["n_embd"])
        self.c_proj = Conv1D(c["n_embd"], inner)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])
        self.mlp = GPT2MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["n_positions"], c["n_embd"])
        self.h = nn.ModuleList([GPT2Block(c) for _ in range(c["n_layer"])])
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]).unsqueeze(0))
        for b in self.h:
            x = b(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = GPT2Model(c)

    def forward(self, ids):
        return F.linear(self.transformer(ids), self.transformer.wte.weight)  # tied lm_head


# ---- Fashion-MNIST models (framework/models/mlp.h, cnn.h) -----------------------------------

class Mlp(nn.Module):
    def __init__(self, hidden, classes=10):
        super().__init__()
        widths = [28 * 28] + hidden + [classes]
        for i in range(len(widths) - 1):
            setattr(self, f"fc{i + 1}", nn.Linear(widths[i], widths[i + 1]))
        self.n = len(widths) - 1

    def forward(self, x):
        h = x.flatten(1)
        for i in range(self.n):
            h = getattr(self, f"fc{i + 1}")(h)
            if i + 1 < self.n:
                h = F.relu(h)
        return h


class ConvBnRelu(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class SmallCnn(nn.Module):
    def __init__(self, channels, hidden, classes=10):
        super().__init__()
        blocks, c, size = [], 1, 28
        for out in channels:
            blocks.append(ConvBnRelu(c, out))
            c, size = out, size // 2
        self.blocks = nn.ModuleList(blocks)
        self.fc1 = nn.Linear(c * size * size, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        for b in self.blocks:
            x = F.max_pool2d(b(x), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    out = {}

    bert_cfg = {"model_type": "bert", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
                "num_attention_heads": 2, "intermediate_size": 32, "hidden_act": "gelu",
                "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 24,
                "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0,
                "id2label": {"0": "a", "1": "b", "2": "c"}, "label2id": {"a": 0, "b": 1, "c": 2},
                "position_embedding_type": "absolute"}
    bert = BertForSequenceClassification(dict(bert_cfg, num_labels=3)).eval()
    randomize(bert)
    ids = torch.randint(1, 40, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[1, 4:] = 0
    ids[1, 4:] = 0
    tt = torch.zeros(2, 7, dtype=torch.int64)
    tt[0, 3:] = 1
    with torch.no_grad():
        logits, hidden, pooled = bert(ids, mask, tt)
    write_safetensors(os.path.join(HERE, "models_bert.safetensors"), bert.state_dict(), {"format": "pt"})
    out["bert"] = {"config": bert_cfg, "input_ids": tensor_json(ids), "attention_mask": tensor_json(mask),
                   "token_type_ids": tensor_json(tt), "logits": tensor_json(logits),
                   "last_hidden_state": tensor_json(hidden), "pooler_output": tensor_json(pooled)}

    gpt_cfg = {"model_type": "gpt2", "vocab_size": 50, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2,
               "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
               "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5, "scale_attn_weights": True}
    gpt = GPT2LMHeadModel(gpt_cfg).eval()
    randomize(gpt)
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        logits = gpt(ids)
    # HF checkpoints carry the tied head and the causal-mask buffers; the importer must accept both.
    state = dict(gpt.state_dict())
    state["lm_head.weight"] = gpt.transformer.wte.weight
    for i in range(gpt_cfg["n_layer"]):
        state[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16)
    write_safetensors(os.path.join(HERE, "models_gpt2.safetensors"), state, {"format": "pt"})
    out["gpt2"] = {"config": gpt_cfg, "input_ids": tensor_json(ids), "logits": tensor_json(logits)}

    mlp = Mlp([8]).eval()
    randomize(mlp, 0.05)
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        logits = mlp(x)
    write_safetensors(os.path.join(HERE, "models_mlp.safetensors"), mlp.state_dict())
    out["mlp"] = {"hidden": [8], "input": tensor_json(x), "logits": tensor_json(logits)}

    cnn = SmallCnn([4, 8], 16).eval()
    randomize(cnn, 0.2)
    with torch.no_grad():
        for b in cnn.blocks:
            b.bn.running_mean.copy_(0.1 * torch.randn_like(b.bn.running_mean))
            b.bn.running_var.copy_(0.5 + torch.rand_like(b.bn.running_var))
        logits = cnn(x)
    state = {k: v for k, v in cnn.state_dict().items() if "num_batches" not in k}
    write_safetensors(os.path.join(HERE, "models_cnn.safetensors"), state)
    out["cnn"] = {"channels": [4, 8], "hidden": 16, "input": tensor_json(x), "logits": tensor_json(logits)}
    write("models.json", out)


if __name__ == "__main__":
    main()
