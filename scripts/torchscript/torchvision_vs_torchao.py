#!/usr/bin/python3
"""torchvision's ResNet-18, MobileNetV2 and VisionTransformer, trained briefly on Fashion-MNIST,
and a BERT written here in plain PyTorch, trained briefly on qforge's language-ID data, through
qforge (TorchScript -> qtrain W8A8 PTQ -> frozen int8) beside torch.ao's FX post-training
quantization of the same float weights, calibrated on the same batches: test accuracy, then
latency of the float, torch.ao int8 and qforge frozen models in one C++ process.

    S=scripts/torchscript/torchvision_vs_torchao.py OUT=/tmp/tv_vs_ao
    /usr/bin/python3 $S train   --out $OUT --models resnet18 --steps 300 --budget-s 540   # repeat until "done"
    /usr/bin/python3 $S compare --out $OUT --build build --models resnet18,mobilenet_v2,vit,bert
    /usr/bin/python3 $S latency --out $OUT --build build --models resnet18,mobilenet_v2,vit,bert

Models (torchvision 0.14 classes, 10 classes, inputs [N, 1, 28, 28] in [0, 1] as qforge's
Fashion-MNIST loader scales them); only the first layer differs from torchvision's:
  resnet18      torchvision.models.resnet18(num_classes=10) with conv1 = Conv2d(1, 64, 3, stride 2,
                padding 1, no bias) in place of Conv2d(3, 64, 7, stride 2, padding 3); maxpool kept
                (28 -> 14 -> 7, then 7 -> 4 -> 2 -> 1 through the stages)
  mobilenet_v2  torchvision.models.mobilenet_v2(num_classes=10) with features[0][0] = Conv2d(1, 32,
                3, stride 2, padding 1, no bias) in place of Conv2d(3, 32, 3, stride 2, ...): only
                the input channels differ (28 -> 14 -> 7 -> 4 -> 2 -> 1 through the stages)
  vit           torchvision.models.VisionTransformer(image_size=28, patch_size=7, num_layers=4,
                num_heads=4, hidden_dim=128, mlp_dim=512, num_classes=10) with conv_proj =
                Conv2d(1, 128, 7, stride 7) in place of Conv2d(3, 128, 7, stride 7), its input
                reshape written so that torch.fx traces it (FxTraceableViT)
each replaced layer initialised as torchvision initialises the one it replaces.
  bert          LangIdBert below: HF BertForSequenceClassification's computation (post-LayerNorm
                encoder, GELU feed-forward, tanh pooler on [CLS]) in plain nn.Embedding / nn.Linear /
                nn.LayerNorm / torch.matmul, with bert_tiny's shape (hidden 128, 2 layers, 4 heads,
                FFN 512, dropout 0.1), no token-type table; padding (id 0) is masked from the ids.
                Data: recipes/bert_int8.yaml's language-ID splits (8 languages from the Debian word
                lists, character-bigram ids, at most 32, each split padded with id 0 to its longest
                phrase), written by `qtrain --export-data` to
                <out>/bert/langid.safetensors on first use; scripted (torch.jit.script) for qforge.

train: AdamW (lr --lr, weight decay 1e-4 for the CNNs, 0.05 for the ViT, 0.01 for the BERT, whose
gradients are clipped to norm 1), batches of 128 of the training split (60 000 images, 64 000
phrases) in a per-epoch seeded order, lr warmed up linearly over the first 5 % of
--steps then cosine to 0, torch.set_num_threads(2). Stops after --budget-s seconds and saves a
checkpoint (weights, optimizer, RNG, step) in <out>/<model>/train.ckpt; the next call resumes it.

compare: needs the finished checkpoint. Calibration: --calib training examples (a seeded pick,
seed 1), --batch per batch, the same batches for both tools. Evaluation: the test split (all
10 000 images or 8 000 phrases, or a seeded pick of --eval). torch.ao: prepare_fx / convert_fx with
get_default_qconfig_mapping on the onednn engine (this LibTorch has no x86 / fbgemm). qforge: the
model traced (gradients enabled, check_trace=False; the BERT scripted) to <out>/<model>/<model>.pt,
qtrain with configs/schemes/w8a8.yaml (data: the calibration examples, then the evaluation ones), frozen,
its model.pt evaluated here with libqforge_torchscript.so loaded. Also saves the traced float
and torch.ao models (<out>/<model>/float.pt, torchao.pt) for `latency`.

latency: build/apps/qbench_torchscript times <out>/<model>/{float,torchao}.pt and qtrain's
model.pt in C++ (torch::jit::load; torch.ao's quantized ops on LibTorch's onednn engine), batch 1
and 32, 1 and 2 threads, warm cache, median of --runs calls (the BERT on 32 token ids uniform over
its vocabulary, no padding): first the three models interleaved call by call in one process,
then each model in a process of its own, alternated for --rounds rounds.
"""
import argparse
import collections
import copy
import json
import math
import os
import platform
import subprocess
import sys
import time

import torch
import torch.nn as nn

try:
    import torchvision
except ImportError:
    sys.exit("torchvision is missing: apt-get install python3-torchvision (Debian's 0.14 matches python3-torch 1.13)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import read_fashion_mnist, read_safetensors, write_safetensors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_BATCH = 128
MODELS = ("resnet18", "mobilenet_v2", "vit", "bert")
BERT_RECIPE = os.path.join(ROOT, "recipes", "bert_int8.yaml")  # its data: language ID, bigrams, 32 tokens


class EncoderLayer(nn.Module):
    """One post-LayerNorm BERT layer: self-attention (additive padding bias on the scores), then
    a GELU feed-forward, each followed by dropout, the residual and a LayerNorm (eps 1e-12)."""

    def __init__(self, hidden, heads, ffn, dropout):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.scale = 1.0 / math.sqrt(hidden // heads)
        self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.attention_out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, ffn)
        self.output = nn.Linear(ffn, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, bias):
        b = x.size(0)
        q = self.query(x).view(b, -1, self.heads, self.head_dim).transpose(1, 2)
        k = self.key(x).view(b, -1, self.heads, self.head_dim).transpose(1, 2)
        v = self.value(x).view(b, -1, self.heads, self.head_dim).transpose(1, 2)
        p = self.drop(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale + bias, dim=-1))
        ctx = torch.matmul(p, v).transpose(1, 2).reshape(b, -1, self.heads * self.head_dim)
        x = self.norm1(x + self.drop(self.attention_out(ctx)))
        return self.norm2(x + self.drop(self.output(nn.functional.gelu(self.intermediate(x)))))


class LangIdBert(nn.Module):
    """A BERT classifier in plain PyTorch (module docstring): ids [B, T] int64, 0 = padding."""

    def __init__(self, vocab, classes=8, hidden=128, layers=2, heads=4, ffn=512, max_len=64, dropout=0.1):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden, padding_idx=0)
        self.position = nn.Embedding(max_len, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList([EncoderLayer(hidden, heads, ffn, dropout) for _ in range(layers)])
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, classes)
        for m in self.modules():  # BERT's initialisation: N(0, 0.02), zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        with torch.no_grad():
            self.word.weight[0].zero_()

    def forward(self, ids):
        positions = torch.ones_like(ids).cumsum(1) - 1  # 0 .. T-1 per row, in tensor ops FX can trace
        x = self.drop(self.norm(self.word(ids) + self.position(positions)))
        # [B, 1, 1, T]: -10000 on padding, built by masked_fill so that no torch.ao observer sees
        # the {0, 1} mask first and then its -10000 multiple (HistogramObserver then asks for GBs)
        bias = torch.zeros_like(ids, dtype=torch.float).masked_fill(ids == 0, -10000.0).unsqueeze(1).unsqueeze(2)
        for layer in self.layers:
            x = layer(x, bias)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


class FxTraceableEncoderBlock(torchvision.models.vision_transformer.EncoderBlock):
    """torchvision's EncoderBlock.forward with `x = attention(...)[0]` for `x, _ = attention(...)`:
    torch 1.13's fx unpacks a Proxy by reading the caller's bytecode, which fails under Python
    3.11 (IndexError in Proxy.__iter__)."""

    def forward(self, input: torch.Tensor):
        x = self.ln_1(input)
        x = self.self_attention(query=x, key=x, value=x, need_weights=False)[0]
        x = self.dropout(x) + input
        return x + self.mlp(self.ln_2(x))


class FxTraceableViT(torchvision.models.VisionTransformer):
    """torchvision's VisionTransformer that torch.fx can trace, so that torch.ao's prepare_fx
    takes it: _process_input without `n, c, h, w = x.shape` and its size asserts, and the encoder
    blocks as FxTraceableEncoderBlock. The computation and the parameters are torchvision's."""

    def __init__(self, **kw):
        super().__init__(**kw)
        for block in self.encoder.layers:
            block.__class__ = FxTraceableEncoderBlock

    def _process_input(self, x):
        x = self.conv_proj(x)  # [N, hidden, H / patch, W / patch]
        return x.reshape(x.size(0), self.hidden_dim, -1).permute(0, 2, 1)


def langid_data(args):
    """recipes/bert_int8.yaml's language-ID splits as qtrain batches them (exported once)."""
    path = os.path.join(args.out, "bert", "langid.safetensors")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([os.path.join(args.build, "apps", "qtrain"), "--recipe", BERT_RECIPE, "--export-data", path],
                       check=True)
    t, meta = read_safetensors(path)
    vocab = 1 + max(int(t[f"{s}.inputs"].max()) for s in ("train", "validation", "test"))
    return t, meta, vocab


def split_data(args, name, split):
    """(inputs, labels) of the model's data: Fashion-MNIST images [N, 1, 28, 28] in [0, 1], or
    the language-ID bigram ids [N, 32]; split "train" or "test"."""
    if name != "bert":
        return read_fashion_mnist(split="train" if split == "train" else "t10k")
    t, _, _ = langid_data(args)
    return t[f"{split}.inputs"], t[f"{split}.labels"]


def make_model(name, args=None):
    """The torchvision model with its first layer taking 28 x 28 x 1 images, or the BERT sized
    for the language-ID data (module docstring)."""
    torch.manual_seed(0)
    if name == "bert":
        _, meta, vocab = langid_data(args)
        return LangIdBert(vocab, classes=len(meta["class_names"].split(",")))
    if name == "resnet18":
        m = torchvision.models.resnet18(num_classes=10)
        m.conv1 = nn.Conv2d(1, 64, 3, stride=2, padding=1, bias=False)
        nn.init.kaiming_normal_(m.conv1.weight, mode="fan_out", nonlinearity="relu")
    elif name == "mobilenet_v2":
        m = torchvision.models.mobilenet_v2(num_classes=10)
        m.features[0][0] = nn.Conv2d(1, 32, 3, stride=2, padding=1, bias=False)
        nn.init.kaiming_normal_(m.features[0][0].weight, mode="fan_out")
    elif name == "vit":
        m = FxTraceableViT(image_size=28, patch_size=7, num_layers=4, num_heads=4,
                                                 hidden_dim=128, mlp_dim=512, num_classes=10)
        m.conv_proj = nn.Conv2d(1, 128, 7, stride=7)
        nn.init.trunc_normal_(m.conv_proj.weight, std=math.sqrt(1 / (7 * 7)))
        nn.init.zeros_(m.conv_proj.bias)
    else:
        sys.exit(f"unknown model {name}: expected one of {', '.join(MODELS)}")
    return m


def checkpoint_path(args, name):
    return os.path.join(args.out, name, "train.ckpt")


def learning_rate(args, step):
    warm = max(1, args.steps // 20)
    if step < warm:
        return args.lr * (step + 1) / warm
    return 0.5 * args.lr * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm)))


def train(args, name):
    torch.set_num_threads(2)
    model = make_model(name, args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr,
                            weight_decay={"vit": 0.05, "bert": 0.01}.get(name, 1e-4))
    path = checkpoint_path(args, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    step = 0
    if os.path.exists(path):
        ck = torch.load(path)
        if ck["steps"] != args.steps or ck["lr"] != args.lr:
            sys.exit(f"{path} was trained for {ck['steps']} steps at lr {ck['lr']}: delete it or pass those")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        torch.set_rng_state(ck["rng"])
        step = ck["step"]
    images, labels = split_data(args, name, "train")
    per_epoch = images.size(0) // TRAIN_BATCH
    model.train()
    t0, seen_loss = time.time(), []
    while step < args.steps and time.time() - t0 < args.budget_s:
        epoch, i = divmod(step, per_epoch)
        order = torch.randperm(images.size(0), generator=torch.Generator().manual_seed(1000 + epoch))
        idx = order[i * TRAIN_BATCH:(i + 1) * TRAIN_BATCH]
        for g in opt.param_groups:
            g["lr"] = learning_rate(args, step)
        loss = nn.functional.cross_entropy(model(images[idx]), labels[idx])
        opt.zero_grad()
        loss.backward()
        if name == "bert":
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        seen_loss.append(float(loss))
        step += 1
        if step % 50 == 0:
            print(f"{name}: step {step}/{args.steps} loss {sum(seen_loss[-50:]) / 50:.4f} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.get_rng_state(),
                "step": step, "steps": args.steps, "lr": args.lr}, path)
    print(f"{name}: {'done' if step >= args.steps else 'resume with the same command'} at step {step} "
          f"of {args.steps} ({time.time() - t0:.0f} s this call)")


def trained_model(args, name):
    path = checkpoint_path(args, name)
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: run `train --models {name}` first")
    ck = torch.load(path)
    if ck["step"] < ck["steps"] and not args.unfinished:
        sys.exit(f"{path} stopped at step {ck['step']} of {ck['steps']}: run `train` again to finish it "
                 "(or pass --unfinished to compare the weights as they are)")
    model = make_model(name, args)
    model.load_state_dict(ck["model"])
    return model.eval(), ck


def accuracy(model, x, y, batch=500):
    with torch.no_grad():
        pred = torch.cat([model(b).argmax(1) for b in x.split(batch)])
    return float((pred == y).double().mean())


def torchao_ptq(model, calib_batches, example):
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    engine = "onednn"
    if engine not in torch.backends.quantized.supported_engines:
        sys.exit(f"torch.ao: engine {engine} missing ({torch.backends.quantized.supported_engines})")
    torch.backends.quantized.engine = engine
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping(engine), (example,))
    with torch.no_grad():
        for b in calib_batches:
            prepared(b)
    return convert_fx(prepared), engine


def trace(model, example):
    """A trace made with gradients enabled (PyTorch's composite attention path) of an eval() model."""
    with torch.enable_grad():
        return torch.jit.trace(model, example, check_trace=False)


def check_trace_batch(name, what, eager, traced, x):
    """The trace answers another batch size as the model does (no batch size baked in)."""
    with torch.no_grad():
        d = float((eager(x) - traced(x)).abs().max())
    if d > 1e-4:
        sys.exit(f"{name}: the traced {what} model differs from eager by {d} at batch {x.size(0)}")


def run_qtrain(args, name, model, calib, evals, eval_labels):
    out = os.path.join(args.out, name)
    pt = os.path.join(out, f"{name}.pt")
    (torch.jit.script(model) if name == "bert" else trace(model, calib[:2])).save(pt)
    data = os.path.join(out, "data.safetensors")
    if calib.dtype == torch.long:  # token ids: each split is padded (id 0) to its own longest phrase
        width = max(calib.size(1), evals.size(1))
        calib, evals = (nn.functional.pad(t, (0, width - t.size(1))) for t in (calib, evals))
    # calibration examples first, then the evaluation ones (qtrain evaluates the last validation_size)
    write_safetensors(data, {"inputs": torch.cat([calib, evals]),
                             "labels": torch.cat([torch.zeros(len(calib), dtype=torch.long), eval_labels])})
    recipe = os.path.join(out, "recipe.yaml")
    with open(recipe, "w") as f:
        f.write(f"include:\n  - {os.path.join(ROOT, 'configs/schemes/w8a8.yaml')}\nseed: 0\n"
                f"model:\n  torchscript: {pt}\n  input_shape: {list(calib.shape[1:])}\n"
                f"data:\n  dataset: tensors\n  file: {data}\n  validation_size: {len(evals)}\n"
                f"  batch_size: {args.batch}\ncalibrate: {{batches: {len(calib) // args.batch}}}\n"
                f"freeze: {{enabled: true}}\n")
    run_dir = os.path.join(out, "run")
    cmd = [os.path.join(args.build, "apps", "qtrain"), "--recipe", recipe, "--out", run_dir]
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if args.quiet else None)
    print(f"{name}: qtrain {time.time() - t0:.0f} s", file=sys.stderr)
    with open(os.path.join(run_dir, "report.json")) as f:
        report = json.load(f)
    return torch.jit.load(os.path.join(run_dir, "model.pt")).eval(), run_dir, report


def torchao_modules(ao):
    """What torch.ao's converted model holds: its module classes, quantized or not, with counts."""
    return dict(collections.Counter(f"{type(m).__module__.split('.')[-2]}.{type(m).__name__}"
                                    for n, m in ao.named_modules() if n and not list(m.children())))


def compare(args, name):
    torch.set_num_threads(2)
    model, ck = trained_model(args, name)
    train_x, _ = split_data(args, name, "train")
    test_x, test_y = split_data(args, name, "test")
    if args.eval < len(test_x):
        pick = torch.randperm(len(test_x), generator=torch.Generator().manual_seed(0))[:args.eval]
        test_x, test_y = test_x[pick], test_y[pick]
    calib = train_x[torch.randperm(len(train_x), generator=torch.Generator().manual_seed(1))[:args.calib]]
    acc = {"float": accuracy(model, test_x, test_y)}
    ao, engine = torchao_ptq(model, calib.split(args.batch), calib[:2])
    acc["torchao"] = accuracy(ao, test_x, test_y)
    qf, run_dir, report = run_qtrain(args, name, model, calib, test_x, test_y)
    acc["qforge"] = accuracy(qf, test_x, test_y)
    out = os.path.join(args.out, name)
    big = calib[:32]
    for what, m in (("float", model), ("torchao", ao)):
        t = trace(m, calib[:2])
        check_trace_batch(name, what, m, t, big)
        t.save(os.path.join(out, f"{what}.pt"))
    row = {"model": name, "torchao_engine": engine, "train_step": ck["step"], "train_steps": ck["steps"],
           "train_lr": ck["lr"],
           "calibration_images": len(calib), "evaluation_images": len(test_x), "accuracy": acc,
           "qtrain_metrics": report.get("metrics"), "qtrain_latency_ms": report.get("latency_ms"),
           "torchao_modules": torchao_modules(ao), "qtrain_out": run_dir}
    with open(os.path.join(out, "compare.json"), "w") as f:
        json.dump(row, f, indent=1)
    print(json.dumps(row), file=sys.stderr)
    return row


def latency(args, name):
    """Two regimes: the three models interleaved in one process (one allocator: a model that frees
    large buffers makes the next one page-fault its own back in), then each model in a process of
    its own, the processes alternated for --rounds rounds (the median of the rounds' medians)."""
    out = os.path.join(args.out, name)
    files = {"float": os.path.join(out, "float.pt"), "torchao": os.path.join(out, "torchao.pt"),
             "qforge": os.path.join(out, "run", "model.pt")}
    for k, p in files.items():
        if not os.path.exists(p):
            sys.exit(f"{p} is missing: run `compare --models {name}` first")
    tool = os.path.join(args.build, "apps", "qbench_torchscript")
    shape = ["--input", "32", "--token-ids", str(langid_data(args)[2])] if name == "bert" else ["--input", "1,28,28"]
    base = [tool] + shape + ["--batch", "1,32", "--threads", "1,2", "--runs", str(args.runs), "--qengine", "onednn"]
    print(f"{name}: one process, the models interleaved")
    js = os.path.join(out, "latency.json")
    subprocess.run(base + ["--json", js] + sum((["--model", f"{k}={p}"] for k, p in files.items()), []), check=True)
    with open(js) as f:
        rows = json.load(f)
    own = collections.defaultdict(list)  # (model, threads, batch) -> median of each round
    for r in range(args.rounds):
        for k, p in files.items():
            js_k = os.path.join(out, f"latency_{k}_{r}.json")
            subprocess.run(base + ["--json", js_k, "--model", f"{k}={p}"], check=True, stdout=subprocess.DEVNULL)
            with open(js_k) as f:
                for row in json.load(f):
                    own[(k, row["threads"], row["batch"])].append(row.get("median_ms"))
    print(f"{name}: a process per model, {args.rounds} rounds alternated (median of the rounds' medians, ms)")
    print("| threads | batch | " + " | ".join(files) + " |")
    print("|---|---|" + "---|" * len(files))
    for t in (1, 2):
        for b in (1, 32):
            cells = []
            for k in files:
                v = [x for x in own[(k, t, b)] if x is not None]
                cells.append(f"{sorted(v)[len(v) // 2]:.3f}" if v else "fails")
            print(f"| {t} | {b} | " + " | ".join(cells) + " |")
    for (k, t, b), v in own.items():
        rows.append({"model": k, "threads": t, "batch": b, "regime": "own process", "round_medians_ms": v})
    with open(js, "w") as f:
        json.dump(rows, f, indent=1)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("train", "compare", "latency"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default="/tmp/torchvision_vs_torchao")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--steps", type=int, default=1200, help="training steps of 128 examples")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--budget-s", type=float, default=540, help="train: seconds before a checkpoint")
    ap.add_argument("--calib", type=int, default=256, help="calibration images (both tools)")
    ap.add_argument("--eval", type=int, default=10000, help="test images (all 10 000, or a seeded pick)")
    ap.add_argument("--batch", type=int, default=32, help="calibration batch (both tools)")
    ap.add_argument("--runs", type=int, default=50, help="latency: timed calls per model and cell")
    ap.add_argument("--rounds", type=int, default=3, help="latency: rounds of one process per model")
    ap.add_argument("--unfinished", action="store_true",
                    help="compare: take a checkpoint stopped before --steps (its step is reported)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    if args.calib % args.batch:
        sys.exit("--calib must be a multiple of --batch")
    if args.command != "train":
        lib = os.path.join(args.build, "framework", "jit", "libqforge_torchscript.so")
        if not os.path.exists(lib):
            sys.exit(f"{lib} is missing: build qforge first (ninja -C build qtrain qforge_torchscript qbench_torchscript)")
        torch.ops.load_library(lib)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, CPU {cpu}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    rows = []
    for name in args.models.split(","):
        if args.command == "train":
            train(args, name)
        elif args.command == "compare":
            rows.append(compare(args, name))
        else:
            latency(args, name)
    if args.command == "compare":
        print("| model (training steps) | float top-1 | torch.ao int8 top-1 | qforge W8A8 frozen top-1 | "
              "qforge - torch.ao (points) |")
        print("|---|---|---|---|---|")
        for r in rows:
            a = r["accuracy"]
            print(f"| {r['model']} ({r['train_step']} of {r['train_steps']}) | {100 * a['float']:.2f} | {100 * a['torchao']:.2f} | {100 * a['qforge']:.2f} | "
                  f"{100 * (a['qforge'] - a['torchao']):+.2f} |")


if __name__ == "__main__":
    main()
