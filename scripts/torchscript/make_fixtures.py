#!/usr/bin/env python3
"""Writes the TorchScript fixtures of tests/jit (tests/fixtures/torchscript/): a small CNN, an
MLP, a CNN with BatchNorms, a BERT-like encoder, an LM with a tied token table, a chain of
rewritten calls, PyTorch's nn.MultiheadAttention, nn.TransformerEncoderLayer and
nn.TransformerEncoder, torchvision's VisionTransformer, residual connections (ResNet / MobileNetV2
style) and x @ W forms with W stored [in, out],
each scripted (torch.jit.script) and traced (torch.jit.trace); the weight x matrix forms and a
small Fashion-MNIST CNN and a byte-level causal LM on the fortunes text trained briefly (scripted
only), with fixed seeds.

    python3 scripts/torchscript/make_fixtures.py [output folder] [--only=fortunes_lm,h5_data,image_folders,langid_encoder]
        [--langid-export=FILE]   (FILE: qtrain --recipe recipes/bert_int8.yaml --export-data FILE)

Needs python3-torch, python3-torchvision, python3-h5py, dataset-fashion-mnist and fortunes (Debian). The C++ tests read the committed files, so they run without Python.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCnn(nn.Module):
    """Conv2d-ReLU-Conv2d-ReLU, a Conv1d over the flattened pixels, a Linear classifier."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.mix = nn.Conv1d(16, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 7 * 7, 10)

    def forward(self, x):
        x = self.features(x)
        x = F.relu(self.mix(x.flatten(2)))
        return self.fc(x.flatten(1))


class Mlp(nn.Module):
    """Two Linear layers, a functional linear on a parameter, and a matmul qforge leaves float."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32, bias=False)
        self.head_weight = nn.Parameter(torch.randn(10, 32) * 0.1)
        self.mix = nn.Parameter(torch.randn(32, 32) * 0.1)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.fc2(h))
        h = h + torch.matmul(h, self.mix)
        return F.linear(h, self.head_weight)


class BnCnn(nn.Module):
    """torchvision-style Conv-BN-ReLU blocks (a conv without bias, one with, a Conv1d-BN1d), a
    BatchNorm after a Linear that stays float, and a bare parameter read elementwise."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.mix = nn.Conv1d(16, 8, 3, padding=1, bias=False)
        self.mix_bn = nn.BatchNorm1d(8)
        self.gain = nn.Parameter(torch.rand(8, 1) + 0.5)
        self.fc = nn.Linear(8 * 7 * 7, 10)
        self.head_bn = nn.BatchNorm1d(10)
        # Running statistics as after training, so folding has something to fold.
        for bn in (self.stem[1], self.block[1], self.mix_bn, self.head_bn):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)
            bn.num_batches_tracked.fill_(100)

    def forward(self, x):
        x = self.block(self.stem(x))
        x = torch.relu(self.mix_bn(self.mix(x.flatten(2)))) * self.gain
        return self.head_bn(self.fc(x.flatten(1)))


class Block(nn.Module):
    """A pre-norm encoder block: q / k / v as nn.Linear, the output projection written as
    x @ W^T on bare parameters, attention scores as a matmul of two activations (stays float),
    LayerNorms (stay float) and a GELU feed-forward."""

    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.scale = 1.0 / math.sqrt(dim // heads)
        self.norm1 = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out_weight = nn.Parameter(torch.randn(dim, dim) / math.sqrt(dim))
        self.out_bias = nn.Parameter(torch.randn(dim) * 0.02)
        self.norm2 = nn.LayerNorm(dim)
        self.ff1 = nn.Linear(dim, ffn)
        self.ff2 = nn.Linear(ffn, dim)

    def forward(self, x):
        b, t, c = x.size(0), x.size(1), x.size(2)
        d = c // self.heads
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, d).transpose(1, 2)
        k = self.k(h).view(b, t, self.heads, d).transpose(1, 2)
        v = self.v(h).view(b, t, self.heads, d).transpose(1, 2)
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        o = torch.matmul(att, v).transpose(1, 2).reshape(b, t, c)
        x = x + torch.matmul(o, self.out_weight.t()) + self.out_bias
        return x + self.ff2(F.gelu(self.ff1(self.norm2(x))))


class TinyEncoder(nn.Module):
    """A BERT-like classifier: token embedding (padding row 0) plus a learned position table,
    two encoder blocks, a final LayerNorm, mean pooling and a Linear head."""

    def __init__(self, vocab=64, dim=32, heads=4, ffn=64, layers=2, classes=5, max_len=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.1)
        self.blocks = nn.ModuleList([Block(dim, heads, ffn) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        x = self.tok(ids) + self.pos[:ids.size(1)]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(1))


def write_encoder(out):
    """encoder_{scripted,traced}.pt and encoder_data.safetensors: input ids, the float logits and
    the logits of PyTorch's own dynamic int8 quantization (torch.ao quantize_dynamic, per-channel
    int8 nn.Linear weights, int8 activations per tensor computed on every call; x86 / fbgemm where this
    PyTorch has it, else onednn, which Debian's python3-torch 1.13 has)."""
    torch.manual_seed(0)
    model = TinyEncoder().eval()
    ids = torch.randint(1, 64, (64, 16))
    ids[:, 12:] = 0  # padded tails
    torch.jit.script(model).save(os.path.join(out, "encoder_scripted.pt"))
    torch.jit.trace(model, ids[:2]).save(os.path.join(out, "encoder_traced.pt"))
    engines = torch.backends.quantized.supported_engines
    torch.backends.quantized.engine = next(e for e in ("x86", "fbgemm", "onednn", "qnnpack") if e in engines)
    dynamic = torch.ao.quantization.quantize_dynamic(
        model, {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8)
    with torch.no_grad():
        tensors = {"input_ids": ids, "float_logits": model(ids), "dynamic_int8_logits": dynamic(ids)}
    write_safetensors(os.path.join(out, "encoder_data.safetensors"), tensors)


class TiedLm(nn.Module):
    """The ends of a causal LM with tied weights: the token table is also the output head, read
    twice in the graph, once by an nn.Linear whose weight *is* the table (Hugging Face's tie) and
    once by F.linear on it with a bias (logits over the vocabulary)."""

    def __init__(self, vocab=48, dim=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.tok.weight
        self.head_bias = nn.Parameter(torch.randn(vocab) * 0.01)

    def forward(self, ids):
        h = self.norm(torch.tanh(self.mix(self.tok(ids))))
        return self.lm_head(h) + F.linear(h, self.tok.weight, self.head_bias)


class Chain(nn.Module):
    """Rewritten calls feeding each other directly: Conv2d -> BatchNorm2d (folded) -> Conv2d, as a
    MobileNetV2 project conv feeds the next expand conv, then Linear -> Linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.down = nn.Linear(8 * 14 * 14, 16)
        self.up = nn.Linear(16, 10)
        self.bn1.running_mean.uniform_(-0.5, 0.5)
        self.bn1.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = self.conv2(self.bn1(self.conv1(x)))
        return self.up(self.down(x.flatten(1)))


class MatmulForms(nn.Module):
    """Each weight x matrix form the front door meets: the ones that become Linear layers (mm,
    addmm with beta = alpha = 1, .T, transpose(0, 1), transpose(-1, 0)) and the ones that stay float
    with a reason (addmm with other beta / alpha or a broadcast bias, x @ W, W @ x, t(W) read
    twice, sparse / scale_grad_by_freq embeddings, a padding_idx past the table, a scripted
    nn.Embedding with padding_idx > 0)."""

    def __init__(self, dim=16, out=8, rows=20):
        super().__init__()
        p = lambda *shape: nn.Parameter(torch.randn(*shape) * 0.2)
        self.w_mm, self.w_addmm, self.b_addmm = p(out, dim), p(out, dim), p(out)
        self.w_scaled, self.b_scaled = p(out, dim), p(out)
        self.w_bcast, self.b_bcast = p(out, dim), p(1)
        self.w_T, self.w_tr, self.w_tr_neg = p(out, dim), p(out, dim), p(out, dim)
        self.w_in_out, self.w_left, self.w_twice = p(dim, out), p(out, dim), p(out, dim)
        self.emb = nn.Embedding(rows, out, padding_idx=0)
        # Scripted, F.embedding checks padding_idx < weight.size(0) when padding_idx > 0: a second read.
        self.emb_pad2 = nn.Embedding(rows, out, padding_idx=2)
        self.emb_sparse = nn.Embedding(rows, out, sparse=True)
        self.w_freq, self.w_pad_past = p(rows, out), p(rows, out)

    def forward(self, x):
        ys = [torch.mm(x, self.w_mm.t()),
              torch.addmm(self.b_addmm, x, self.w_addmm.t()),
              torch.addmm(self.b_scaled, x, self.w_scaled.t(), beta=0.5, alpha=2.0),
              torch.addmm(self.b_bcast, x, self.w_bcast.t()),
              torch.matmul(x, self.w_T.T),
              x @ self.w_tr.transpose(0, 1),
              x @ self.w_tr_neg.transpose(-1, 0),
              x @ self.w_in_out,
              torch.mm(self.w_left, x.t()).view(-1).view(-1, x.size(0)).t()]  # W @ x, viewed as torch returns it
        twice = self.w_twice.t()
        ys.append(torch.mm(x, twice) + torch.mm(torch.tanh(x), twice))
        ids = (x[:, :4].abs() * 7.0).long() % 20
        ys.append(self.emb(ids).sum(1))
        ys.append(self.emb_pad2(ids).sum(1))
        ys.append(self.emb_sparse(ids).sum(1))
        ys.append(F.embedding(ids, self.w_freq, scale_grad_by_freq=True).sum(1))
        ys.append(torch.embedding(self.w_pad_past, ids, 25).sum(1))
        return torch.cat(ys, 1)


class Conv1D(nn.Module):
    """GPT-2's Conv1D (Hugging Face transformers): a Linear whose weight is stored [in, out] and
    applied as addmm(bias, x, weight)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        y = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return y.view(x.size(0), x.size(1), self.nf)


class InOutForms(nn.Module):
    """x @ W with W stored [in, out]: addmm (Conv1D), mm and matmul on bare parameters."""

    def __init__(self, dim=16, hidden=24, out=8):
        super().__init__()
        self.c_fc = Conv1D(hidden, dim)
        self.w_mm = nn.Parameter(torch.randn(hidden, hidden) * 0.2)
        self.w_matmul = nn.Parameter(torch.randn(hidden, out) * 0.2)

    def forward(self, x):
        h = torch.tanh(self.c_fc(x))
        h = torch.mm(h.reshape(-1, h.size(-1)), self.w_mm).view(h.size(0), h.size(1), -1)
        return torch.matmul(torch.relu(h), self.w_matmul)


class BufferMatmul(nn.Module):
    """x @ B on a registered buffer (a fixed matrix, kept float) before x @ W on a parameter."""

    def __init__(self, dim=16, out=8):
        super().__init__()
        self.register_buffer("rot", torch.linalg.qr(torch.randn(dim, dim))[0])
        self.w = nn.Parameter(torch.randn(dim, out) * 0.2)

    def forward(self, x):
        return torch.matmul(torch.matmul(x, self.rot), self.w)


class BilinearAttention(nn.Module):
    """Scores q W gate(k)^T: `x @ self.weight` (a Linear named by this module's path, its attribute
    being called `weight`), a child Linear and a product of two activations, which qforge names
    beside that layer, as it registers the module's other parameter."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, dim) * 0.3)
        self.gate = nn.Linear(dim, dim)
        self.temperature = nn.Parameter(torch.tensor(0.8))  # another parameter of the layer's module

    def forward(self, q, k):
        return torch.matmul(torch.matmul(q, self.weight), self.gate(k).transpose(1, 2)) * self.temperature


class Sdpa(nn.Module):
    """Attention with no parameters of its own."""

    def forward(self, q, k, v):
        return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(1, 2)), dim=-1), v)


class ProductBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.attn = BilinearAttention(dim)
        self.proj = nn.Linear(dim, dim)
        self.sdpa = Sdpa()


class ProductForms(nn.Module):
    """Products of two activations where naming them is hard: a ModuleList whose blocks' children
    are called from the root's unrolled loop (one call site for both blocks; one of them reads no
    attribute), a bmm in the root's own forward, and a bmm writing into an out= tensor (kept float)."""

    def __init__(self, dim=8):
        super().__init__()
        self.blocks = nn.ModuleList([ProductBlock(dim) for _ in range(2)])

    def forward(self, x):
        for blk in self.blocks:
            a = torch.softmax(blk.attn(x, x), dim=-1)
            x = x + blk.proj(torch.bmm(a, x))
            x = x + blk.sdpa(x, x, x)
        scores = torch.empty(x.size(0), x.size(1), x.size(1))
        torch.bmm(x.detach(), x.detach().transpose(1, 2), out=scores)  # out= takes no gradients
        return x + scores.mean(-1, keepdim=True)


class EinsumAttention(nn.Module):
    """Attention written with torch.einsum, as much research code writes it: q k^T and att v become
    MatMuls, and so does an implicit-output "ij,jk"; a dot product per token (one contracted index,
    no free one) stays float."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(torch.einsum("bhid,bhjd->bhij", q, k) * 0.5, dim=-1)
        o = torch.einsum("bhij,bhjd->bhid", att, v).transpose(1, 2).reshape(b, t, c)
        y = self.out(o)
        # An implicit output ("ij,jk" is "ij,jk->ik"): a product too.
        return y + torch.einsum("bti,bti->bt", y, x).unsqueeze(-1) + torch.einsum("ij,jk", y[0], x[0].t()).mean()


def write_matmul_forms(out):
    """matmul_forms_scripted.pt: MatmulForms."""
    torch.manual_seed(0)
    torch.jit.script(MatmulForms().eval()).save(os.path.join(out, "matmul_forms_scripted.pt"))


def write_product_forms(out):
    """product_forms_{scripted,traced}.pt: ProductForms; einsum_attention_{scripted,traced}.pt: EinsumAttention."""
    torch.manual_seed(0)
    net = ProductForms().eval()
    torch.jit.script(net).save(os.path.join(out, "product_forms_scripted.pt"))
    torch.jit.trace(net, torch.randn(2, 5, 8)).save(os.path.join(out, "product_forms_traced.pt"))
    torch.manual_seed(0)
    einsum = EinsumAttention().eval()
    torch.jit.script(einsum).save(os.path.join(out, "einsum_attention_scripted.pt"))
    torch.jit.trace(einsum, torch.randn(2, 5, 16)).save(os.path.join(out, "einsum_attention_traced.pt"))


def write_buffer_matmul(out):
    """buffer_matmul_{scripted,traced}.pt: BufferMatmul."""
    torch.manual_seed(0)
    net = BufferMatmul().eval()
    torch.jit.script(net).save(os.path.join(out, "buffer_matmul_scripted.pt"))
    torch.jit.trace(net, torch.randn(2, 5, 16)).save(os.path.join(out, "buffer_matmul_traced.pt"))


class MhaNet(nn.Module):
    """PyTorch's own nn.MultiheadAttention (packed in_proj_weight, NonDynamicallyQuantizableLinear
    out_proj) as self-attention, mean pooling and a Linear head."""

    def __init__(self, batch_first, dim=16, heads=2, classes=5):
        super().__init__()
        self.batch_first = batch_first
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=batch_first)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        a = self.attn(x, x, x, need_weights=False)[0]
        return self.head(a.mean(1 if self.batch_first else 0))


class MhaKpmNet(nn.Module):
    """MhaNet called as nn.MultiheadAttention's defaults are: need_weights=True (averaged attention
    weights returned too) and a key padding mask as a second input (True marks a padded key)."""

    def __init__(self, dim=16, heads=2, classes=5):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, x, key_padding_mask):
        a, w = self.attn(x, x, x, key_padding_mask=key_padding_mask)
        return self.head(a.mean(1)), w


def write_mha_kpm(out):
    """mha_kpm_{scripted,traced}.pt: MhaKpmNet, batch first."""
    torch.manual_seed(0)
    net = MhaKpmNet().eval()
    x = torch.randn(2, 6, 16)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, 4:] = True
    torch.jit.script(net).save(os.path.join(out, "mha_kpm_scripted.pt"))
    torch.jit.trace(net, (x, kpm), check_trace=False).save(os.path.join(out, "mha_kpm_traced.pt"))


def write_transformer_layers(out):
    """PyTorch's own attention and encoder layer, scripted and traced: mha_{bf,sf}_*.pt (batch first
    or sequence first), encoder_layer_{bf,sf}_{pre,post}_*.pt (norm_first true / false), and
    mha_nograd_traced.pt, traced under torch.no_grad() (PyTorch's fused path is what it records).
    Traces are made with gradients enabled, as torch.jit.trace does by default, and check_trace=False
    (the check re-runs under no_grad, where eval-mode PyTorch takes its fused path)."""
    for bf in (True, False):
        torch.manual_seed(0)
        net = MhaNet(bf).eval()
        x = torch.randn((2, 6, 16) if bf else (6, 2, 16))
        name = "mha_" + ("bf" if bf else "sf")
        torch.jit.script(net).save(os.path.join(out, name + "_scripted.pt"))
        torch.jit.trace(net, x, check_trace=False).save(os.path.join(out, name + "_traced.pt"))
        if bf:
            with torch.no_grad():
                torch.jit.trace(net, x, check_trace=False).save(os.path.join(out, "mha_nograd_traced.pt"))
        for norm_first in (True, False):
            torch.manual_seed(0)
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=bf, norm_first=norm_first).eval()
            name = "encoder_layer_" + ("bf" if bf else "sf") + ("_pre" if norm_first else "_post")
            torch.jit.script(layer).save(os.path.join(out, name + "_scripted.pt"))
            torch.jit.trace(layer, x, check_trace=False).save(os.path.join(out, name + "_traced.pt"))


class EncoderStackKpm(nn.Module):
    """nn.TransformerEncoder called with a key padding mask as a second input (torch.jit.trace takes
    tensor inputs only, so the mask needs a wrapper to reach a trace)."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, x, key_padding_mask):
        return self.encoder(x, src_key_padding_mask=key_padding_mask)


def write_encoder_stack(out):
    """nn.TransformerEncoder (the stack) of two TransformerEncoderLayer(16, 2, 32), scripted and traced:
    - encoder_stack_nested_{scripted,traced}.pt: batch first, post-norm, a final LayerNorm,
      enable_nested_tensor=True, the configuration whose eval / no_grad run with a key padding mask
      takes PyTorch's nested-tensor fast path; scripted bare (forward(src, mask, src_key_padding_mask)),
      traced through EncoderStackKpm (x and the mask as inputs);
    - encoder_stack_plain_{scripted,traced}.pt: sequence first, norm_first, no final norm,
      enable_nested_tensor=False; scripted bare, traced with src only;
    - encoder_stack_nograd_traced.pt: the nested one traced under torch.no_grad() with a key padding
      mask, which records PyTorch's nested path (_nested_tensor_from_mask, the fused layers)."""
    for name, bf, norm_first, final_norm, nested in (("nested", True, False, True, True),
                                                    ("plain", False, True, False, False)):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=bf, norm_first=norm_first)
        stack = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16) if final_norm else None,
                                      enable_nested_tensor=nested).eval()
        x = torch.randn((2, 6, 16) if bf else (6, 2, 16))
        torch.jit.script(stack).save(os.path.join(out, "encoder_stack_%s_scripted.pt" % name))
        if nested:
            kpm = torch.zeros(2, 6, dtype=torch.bool)
            kpm[1, 4:] = True
            traced = torch.jit.trace(EncoderStackKpm(stack).eval(), (x, kpm), check_trace=False)
            with torch.no_grad():
                torch.jit.trace(EncoderStackKpm(stack).eval(), (x, kpm), check_trace=False).save(
                    os.path.join(out, "encoder_stack_nograd_traced.pt"))
        else:
            traced = torch.jit.trace(stack, x, check_trace=False)
        traced.save(os.path.join(out, "encoder_stack_%s_traced.pt" % name))


def write_vit(out):
    """vit_{scripted,traced}.pt: torchvision's VisionTransformer (vit_b_16's code) at 28x28 with
    7x7 patches, 2 layers of 2 heads, width 64, MLP 128, 10 classes (random initialisation)."""
    import torchvision
    torch.manual_seed(0)
    vit = torchvision.models.VisionTransformer(image_size=28, patch_size=7, num_layers=2, num_heads=2,
                                               hidden_dim=64, mlp_dim=128, num_classes=10).eval()
    # torchvision zero-initialises the head: a random one, so the logits depend on the weights.
    nn.init.normal_(vit.heads.head.weight, std=0.1)
    torch.jit.script(vit).save(os.path.join(out, "vit_scripted.pt"))
    torch.jit.trace(vit, torch.randn(2, 3, 28, 28), check_trace=False).save(os.path.join(out, "vit_traced.pt"))


class FmnistCnn(nn.Module):
    """A small Fashion-MNIST classifier: Conv-BN-ReLU-pool, Conv-ReLU-pool, a strided Conv, two
    Linear layers (12k parameters)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU())
        self.fc1 = nn.Linear(16 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.features(x).flatten(1))))


class ResidualCnn(nn.Module):
    """Residual connections as torchvision writes them (after a max pool, as ResNet's stem): a BasicBlock (conv-BN-ReLU-conv-BN, `out +=
    identity`, ReLU), a downsampling block whose shortcut is a strided 1x1 conv (`relu(out +
    shortcut)`), and MobileNetV2's `x + conv(x)` without a ReLU (a depthwise conv here)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.conv4 = nn.Conv2d(16, 16, 3, padding=1)
        self.down = nn.Conv2d(8, 16, 1, stride=2)
        self.project = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.fc = nn.Linear(16 * 7 * 7, 10)
        for bn in (self.bn1, self.bn2):
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.stem(x)), 3, 1, 1)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        x = F.relu(out)
        out = self.conv4(F.relu(self.conv3(x)))
        x = F.relu(out + self.down(x))
        x = x + self.project(x)
        return self.fc(x.flatten(1))


def write_residual(out):
    torch.manual_seed(0)
    net = ResidualCnn().eval()
    torch.jit.script(net).save(os.path.join(out, "residual_cnn_scripted.pt"))
    torch.jit.trace(net, torch.randn(2, 1, 14, 14)).save(os.path.join(out, "residual_cnn_traced.pt"))


def read_fashion_mnist(folder="/usr/share/datasets/fashion-mnist", split="train"):
    """The images of `split` ("train": 60 000, "t10k": the 10 000 test images) as [N, 1, 28, 28]
    in [0, 1], as qforge's data::load_fashion_mnist scales them, and their labels, from Debian's
    dataset-fashion-mnist IDX files."""
    import gzip
    import numpy as np
    path = os.path.join(folder, f"{split}-images-idx3-ubyte.gz")
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: apt-get install dataset-fashion-mnist")
    with gzip.open(path) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(folder, f"{split}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(images.astype("float32") / 255.0), torch.from_numpy(labels.astype("int64"))


def write_fmnist_cnn(out, steps=400):
    """fmnist_cnn_scripted.pt: FmnistCnn trained briefly (Adam, 400 steps of 64 images, a few
    seconds on a CPU) on Fashion-MNIST's training images, saved in eval mode (its BatchNorm folds)."""
    torch.manual_seed(0)
    images, labels = read_fashion_mnist()
    model = FmnistCnn()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(steps):
        idx = torch.randint(0, images.size(0), (64,))
        loss = F.cross_entropy(model(images[idx]), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.jit.script(model.eval()).save(os.path.join(out, "fmnist_cnn_scripted.pt"))


class FortunesLm(nn.Module):
    """A small GPT-style causal LM over bytes (vocabulary 256): token and position tables, pre-norm
    blocks of causal self-attention (one packed qkv Linear, the scores masked with -inf above the
    diagonal) and a GELU MLP, a final LayerNorm and an output head tied to the token table.
    forward(ids [B, T]) -> logits [B, T, 256], T up to max_len."""

    def __init__(self, vocab=256, dim=64, heads=4, ffn=128, layers=2, max_len=64):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.ln1 = nn.ModuleList([nn.LayerNorm(dim) for _ in range(layers)])
        self.qkv = nn.ModuleList([nn.Linear(dim, 3 * dim) for _ in range(layers)])
        self.proj = nn.ModuleList([nn.Linear(dim, dim) for _ in range(layers)])
        self.ln2 = nn.ModuleList([nn.LayerNorm(dim) for _ in range(layers)])
        self.fc1 = nn.ModuleList([nn.Linear(dim, ffn) for _ in range(layers)])
        self.fc2 = nn.ModuleList([nn.Linear(ffn, dim) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.tok.weight

    def forward(self, ids):
        b, t = ids.size(0), ids.size(1)
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=ids.device), 1)
        for ln1, qkv, proj, ln2, fc1, fc2 in zip(self.ln1, self.qkv, self.proj, self.ln2, self.fc1, self.fc2):
            q, k, v = qkv(ln1(x)).chunk(3, -1)
            d = q.size(-1) // self.heads
            q = q.reshape(b, t, self.heads, d).transpose(1, 2)
            k = k.reshape(b, t, self.heads, d).transpose(1, 2)
            v = v.reshape(b, t, self.heads, d).transpose(1, 2)
            w = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
            w = torch.softmax(w.masked_fill(mask, float("-inf")), -1)
            x = x + proj(torch.matmul(w, v).transpose(1, 2).reshape(b, t, -1))
            x = x + fc2(F.gelu(fc1(ln2(x))))
        return self.lm_head(self.ln_f(x))


def fortunes_bytes(folder="/usr/share/games/fortunes"):
    """The fortunes corpus as qforge's data::load_fortunes reads it: every regular file of the
    folder but the .dat indexes and symlinks, in sorted path order, concatenated as bytes."""
    if not os.path.isdir(folder):
        sys.exit(f"{folder} is missing: apt-get install fortunes")
    paths = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    data = b"".join(open(p, "rb").read() for p in paths
                    if os.path.isfile(p) and not os.path.islink(p) and not p.endswith(".dat"))
    return torch.tensor(list(data), dtype=torch.int64)


def write_fortunes_lm(out, steps=2000):
    """fortunes_lm_scripted.pt: FortunesLm trained briefly (AdamW, 2000 steps of 32 windows of 64
    bytes, about a minute and a half on a CPU) on the first 90 % of the fortunes bytes, load_fortunes's
    training split; the test split (the last 5 %) is never seen. Saved in eval mode."""
    torch.manual_seed(0)
    data = fortunes_bytes()
    train = data[: int(data.numel() * 0.9)]
    model = FortunesLm()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = 3e-3 * 0.5 * (1 + math.cos(math.pi * step / steps))
        starts = torch.randint(0, train.numel() - 65, (32,))
        windows = torch.stack([train[s:s + 65] for s in starts.tolist()])
        logits = model(windows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"fortunes_lm: training loss {loss.item():.3f} after {steps} steps")
    torch.jit.script(model.eval()).save(os.path.join(out, "fortunes_lm_scripted.pt"))


def write_h5_data(out):
    """cnn_bn_data.h5: the first 192 examples of cnn_bn_data.safetensors as h5py writes a user's
    data file (datasets `inputs` float32 [192, 1, 14, 14] and `labels` int64 [192] at the root, and
    two string datasets beside them, libver v110: qforge refuses HDF5's earliest formats), and cnn_bn_data_earliest.h5, the first 8
    in h5py's default (earliest) format, which qforge refuses naming the libver option."""
    import h5py
    import numpy as np
    data = read_safetensors(os.path.join(out, "cnn_bn_data.safetensors"))[0]
    x, y = data["inputs"][:192].numpy(), data["labels"][:192].numpy()
    with h5py.File(os.path.join(out, "cnn_bn_data.h5"), "w", libver=("v110", "v110")) as f:
        f.create_dataset("inputs", data=x)
        f.create_dataset("labels", data=y)
        # What else a user's file holds beside them (strings qforge does not read): left unread.
        f.create_dataset("class_names", data=np.array([b"c%d" % i for i in range(int(y.max()) + 1)]))
        f.create_dataset("source", data="BnCnn's own top-1 classes", dtype=h5py.string_dtype())
    with h5py.File(os.path.join(out, "cnn_bn_data_earliest.h5"), "w") as f:
        f.create_dataset("inputs", data=x[:8])
        f.create_dataset("labels", data=y[:8])


def write_langid_encoder(out, export, steps=1500):
    """langid_encoder_scripted.pt: TinyEncoder (1 block, width 32, 8 classes, 32 positions) over the
    language-ID phrases as `qtrain --recipe recipes/bert_int8.yaml --export-data FILE` writes them
    (character bigrams, 8000 phrases per language, seed 0: what recipes/torchscript_langid_int8.yaml
    reads), trained briefly (Adam, 1500 steps of 128 phrases, about 20 s) on the training split."""
    if export is None:
        sys.exit("--only=langid_encoder needs --langid-export=FILE: qtrain --recipe recipes/bert_int8.yaml --export-data FILE")
    data = read_safetensors(export)[0]
    x, y = data["train.inputs"], data["train.labels"]
    vocab = int(max(x.max(), data["validation.inputs"].max(), data["test.inputs"].max())) + 1
    torch.manual_seed(0)
    model = TinyEncoder(vocab=vocab, dim=32, heads=4, ffn=64, layers=1, classes=8, max_len=32)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        idx = torch.randint(0, x.size(0), (128,))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(data["test.inputs"]).argmax(1) == data["test.labels"]).float().mean().item()
    print(f"langid_encoder: vocabulary {vocab}, training loss {loss.item():.3f}, test accuracy {acc:.4f}")
    torch.jit.script(model).save(os.path.join(out, "langid_encoder_scripted.pt"))


FMNIST_CLASSES = ("T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                  "Ankle-boot")


def write_image_folders(out):
    """fmnist_images/: Fashion-MNIST's first 160 test images as 8-bit grey PNGs (PIL) in
    torchvision's ImageFolder layout, one folder per class named "<label>_<name>" so that the
    sorted folder order is the label order, each file "<test index>.png". colour_images/: small
    images in the forms a user's folder holds (an RGB JPEG, an RGBA PNG, a palette PNG, a grey JPEG,
    a PNG with a gAMA chunk; and a 16-bit grey PNG qforge refuses) and colour_images_expected.safetensors, what PIL makes of each as torchvision's ImageFolder
    loads it: `<name>.rgb` = convert("RGB"), `<name>.l` = convert("RGB").convert("L") (uint8
    [H, W, C])."""
    import shutil
    import numpy as np
    from PIL import Image
    images, labels = read_fashion_mnist(split="t10k")
    folder = os.path.join(out, "fmnist_images")
    shutil.rmtree(folder, ignore_errors=True)
    for i in range(160):
        label = int(labels[i])
        d = os.path.join(folder, f"{label}_{FMNIST_CLASSES[label]}")
        os.makedirs(d, exist_ok=True)
        pixels = (images[i, 0].numpy() * 255.0 + 0.5).astype(np.uint8)  # exact: the IDX bytes
        Image.fromarray(pixels, mode="L").save(os.path.join(d, f"{i:04d}.png"))
    colour = os.path.join(out, "colour_images")
    shutil.rmtree(colour, ignore_errors=True)
    os.makedirs(colour)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:20, 0:24]
    rgb = np.stack([xx * 10, yy * 12, (xx + yy) * 5], -1).astype(np.uint8)
    rgb = np.clip(rgb.astype(int) + rng.integers(-20, 20, rgb.shape), 0, 255).astype(np.uint8)
    Image.fromarray(rgb, "RGB").save(os.path.join(colour, "rgb.jpg"), quality=90)
    rgba = np.concatenate([rgb, rng.integers(0, 256, (20, 24, 1)).astype(np.uint8)], -1)
    Image.fromarray(rgba, "RGBA").save(os.path.join(colour, "rgba.png"))
    Image.fromarray(rgb, "RGB").quantize(16).save(os.path.join(colour, "palette.png"))
    Image.fromarray(rgb[..., 1], "L").save(os.path.join(colour, "grey.jpg"), quality=85)
    # A gAMA chunk of 1/1.8 (old Mac software wrote them): PIL, and so ImageFolder, ignores it.
    import struct
    from PIL import PngImagePlugin
    info = PngImagePlugin.PngInfo()
    info.add(b"gAMA", struct.pack(">I", 55556))
    Image.fromarray(rgb, "RGB").save(os.path.join(colour, "gamma.png"), pnginfo=info)
    # 16-bit grey samples, which qforge refuses (PIL reads them as 32-bit integers).
    Image.fromarray((rgb[..., 0].astype(np.uint16) * 257), "I;16").save(os.path.join(colour, "grey16.png"))
    expected = {}
    for name in ("rgb.jpg", "rgba.png", "palette.png", "grey.jpg", "gamma.png"):
        img = Image.open(os.path.join(colour, name)).convert("RGB")
        expected[name + ".rgb"] = torch.from_numpy(np.asarray(img).copy())
        expected[name + ".l"] = torch.from_numpy(np.asarray(img.convert("L")).copy()).unsqueeze(-1)
    write_safetensors(os.path.join(out, "colour_images_expected.safetensors"), expected)


def write_safetensors(path, tensors):
    """The safetensors layout (8-byte header length, JSON header, raw little-endian bytes) by hand:
    the Python safetensors package is not a Debian package here."""
    import json
    import struct
    dtypes = {torch.float32: "F32", torch.int64: "I64", torch.uint8: "U8"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    """The tensors of a safetensors file (read_safetensors' layout by hand, as write_safetensors),
    and its __metadata__."""
    import json
    import struct
    dtypes = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
              "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    tensors = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        b, e = h["data_offsets"]
        t = torch.frombuffer(bytearray(blob[b:e]), dtype=dtypes[h["dtype"]]) if e > b else torch.empty(0, dtype=dtypes[h["dtype"]])
        tensors[name] = t.reshape(h["shape"])
    return tensors, header.get("__metadata__", {})


def write_recipe_data(out, model):
    """cnn_bn_data.safetensors: 384 random images and, as labels, the float model's own top-1
    class, so a quantized model's accuracy on it is its top-1 agreement with the float model."""
    torch.manual_seed(1)
    inputs = torch.randn(384, 1, 14, 14)
    with torch.no_grad():
        labels = model(inputs).argmax(1)
    write_safetensors(os.path.join(out, "cnn_bn_data.safetensors"), {"inputs": inputs, "labels": labels})


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    only = [n for a in sys.argv[1:] if a.startswith("--only=") for n in a.split("=", 1)[1].split(",")]
    export = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--langid-export=")), None)
    for a in sys.argv[1:]:
        if a.startswith("--") and not a.startswith(("--only=", "--langid-export=")):
            sys.exit(f"unknown option {a}: expected --only=NAME[,NAME] and --langid-export=FILE")
    out = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "torchscript")
    os.makedirs(out, exist_ok=True)
    if only:  # --only=fortunes_lm: that fixture alone (the others' files stay as committed)
        writers = {"fortunes_lm": write_fortunes_lm, "h5_data": write_h5_data, "image_folders": write_image_folders,
                   "product_forms": write_product_forms, "matmul_forms": write_matmul_forms,
                   "langid_encoder": lambda o: write_langid_encoder(o, export)}
        for name in only:
            if name not in writers:
                sys.exit(f"--only={name}: expected one of {', '.join(writers)}")
            writers[name](out)
        print("wrote", out)
        return
    for name, cls, example in (("cnn", SmallCnn, torch.randn(2, 1, 14, 14)),
                               ("mlp", Mlp, torch.randn(4, 32)),
                               ("cnn_bn", BnCnn, torch.randn(2, 1, 14, 14))):
        torch.manual_seed(0)
        model = cls().eval()
        torch.jit.script(model).save(os.path.join(out, name + "_scripted.pt"))
        torch.jit.trace(model, example).save(os.path.join(out, name + "_traced.pt"))
        if name == "cnn_bn":
            write_recipe_data(out, model)
    write_encoder(out)
    torch.manual_seed(0)
    tied = TiedLm().eval()
    torch.jit.script(tied).save(os.path.join(out, "tied_lm_scripted.pt"))
    torch.jit.trace(tied, torch.randint(0, 48, (2, 8))).save(os.path.join(out, "tied_lm_traced.pt"))
    torch.manual_seed(0)
    chain = Chain().eval()
    torch.jit.script(chain).save(os.path.join(out, "chain_scripted.pt"))
    torch.jit.trace(chain, torch.randn(2, 1, 14, 14)).save(os.path.join(out, "chain_traced.pt"))
    write_matmul_forms(out)
    torch.manual_seed(0)
    in_out = InOutForms().eval()
    torch.jit.script(in_out).save(os.path.join(out, "in_out_forms_scripted.pt"))
    torch.jit.trace(in_out, torch.randn(2, 5, 16)).save(os.path.join(out, "in_out_forms_traced.pt"))
    write_transformer_layers(out)
    write_residual(out)
    write_mha_kpm(out)
    write_encoder_stack(out)
    write_buffer_matmul(out)
    write_product_forms(out)
    write_vit(out)
    write_fmnist_cnn(out)
    write_fortunes_lm(out)
    write_h5_data(out)
    write_image_folders(out)
    if export is not None:
        write_langid_encoder(out, export)
    else:
        print("langid_encoder_scripted.pt kept (give --langid-export=FILE to write it again)")
    print("wrote", out)


if __name__ == "__main__":
    main()
