#!/usr/bin/python3
"""torchvision's ResNet-18, MobileNetV2 and VisionTransformer, trained briefly on Fashion-MNIST,
through qforge (TorchScript -> qtrain W8A8 PTQ -> frozen int8) beside torch.ao's FX post-training
quantization of the same float weights, calibrated on the same batches: test accuracy, then
latency of the float, torch.ao int8 and qforge frozen models in one C++ process.

    S=scripts/torchscript/torchvision_vs_torchao.py OUT=/tmp/tv_vs_ao
    /usr/bin/python3 $S train   --out $OUT --models resnet18 --budget-s 540   # repeat until "done"
    /usr/bin/python3 $S compare --out $OUT --build build --models resnet18,mobilenet_v2,vit
    /usr/bin/python3 $S latency --out $OUT --build build --models resnet18,mobilenet_v2,vit

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
                Conv2d(1, 128, 7, stride 7) in place of Conv2d(3, 128, 7, stride 7)
each replaced layer initialised as torchvision initialises the one it replaces.

train: AdamW (lr --lr, weight decay 1e-4 for the CNNs, 0.05 for the ViT), batches of 128 of the
60 000 training images in a per-epoch seeded order, lr warmed up linearly over the first 5 % of
--steps then cosine to 0, torch.set_num_threads(2). Stops after --budget-s seconds and saves a
checkpoint (weights, optimizer, RNG, step) in <out>/<model>/train.ckpt; the next call resumes it.

compare: needs the finished checkpoint. Calibration: --calib training images (a seeded pick,
seed 1), --batch per batch, the same batches for both tools. Evaluation: Fashion-MNIST's test
split (all 10 000, or a seeded pick of --eval). torch.ao: prepare_fx / convert_fx with
get_default_qconfig_mapping on the onednn engine (this LibTorch has no x86 / fbgemm). qforge: the
model traced (gradients enabled, check_trace=False) to <out>/<model>/<model>.pt, qtrain with
configs/schemes/w8a8.yaml (data: the calibration images, then the evaluation images), frozen,
its model.pt evaluated here with libqforge_torchscript.so loaded. Also saves the traced float
and torch.ao models (<out>/<model>/float.pt, torchao.pt) for `latency`.

latency: build/apps/qbench_torchscript times <out>/<model>/{float,torchao}.pt and qtrain's
model.pt in one C++ process (torch::jit::load; torch.ao's quantized ops on LibTorch's onednn
engine), batch 1 and 32, 1 and 2 threads, warm cache, median of --runs interleaved calls.
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
from make_fixtures import read_fashion_mnist, write_safetensors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_BATCH = 128


def make_model(name):
    """The torchvision model with its first layer taking 28 x 28 x 1 images (module docstring)."""
    torch.manual_seed(0)
    if name == "resnet18":
        m = torchvision.models.resnet18(num_classes=10)
        m.conv1 = nn.Conv2d(1, 64, 3, stride=2, padding=1, bias=False)
        nn.init.kaiming_normal_(m.conv1.weight, mode="fan_out", nonlinearity="relu")
    elif name == "mobilenet_v2":
        m = torchvision.models.mobilenet_v2(num_classes=10)
        m.features[0][0] = nn.Conv2d(1, 32, 3, stride=2, padding=1, bias=False)
        nn.init.kaiming_normal_(m.features[0][0].weight, mode="fan_out")
    elif name == "vit":
        m = torchvision.models.VisionTransformer(image_size=28, patch_size=7, num_layers=4, num_heads=4,
                                                 hidden_dim=128, mlp_dim=512, num_classes=10)
        m.conv_proj = nn.Conv2d(1, 128, 7, stride=7)
        nn.init.trunc_normal_(m.conv_proj.weight, std=math.sqrt(1 / (7 * 7)))
        nn.init.zeros_(m.conv_proj.bias)
    else:
        sys.exit(f"unknown model {name}: expected resnet18, mobilenet_v2 or vit")
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
    model = make_model(name)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05 if name == "vit" else 1e-4)
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
    images, labels = read_fashion_mnist(split="train")
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
    model = make_model(name)
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
    trace(model, calib[:2]).save(pt)
    data = os.path.join(out, "data.safetensors")
    # calibration images first, then the evaluation images (qtrain evaluates the last validation_size)
    write_safetensors(data, {"inputs": torch.cat([calib, evals]),
                             "labels": torch.cat([torch.zeros(len(calib), dtype=torch.long), eval_labels])})
    recipe = os.path.join(out, "recipe.yaml")
    with open(recipe, "w") as f:
        f.write(f"include:\n  - {os.path.join(ROOT, 'configs/schemes/w8a8.yaml')}\nseed: 0\n"
                f"model:\n  torchscript: {pt}\n  input_shape: [1, 28, 28]\n"
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
    train_x, _ = read_fashion_mnist(split="train")
    test_x, test_y = read_fashion_mnist(split="t10k")
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
    out = os.path.join(args.out, name)
    files = {"float": os.path.join(out, "float.pt"), "torchao": os.path.join(out, "torchao.pt"),
             "qforge": os.path.join(out, "run", "model.pt")}
    for k, p in files.items():
        if not os.path.exists(p):
            sys.exit(f"{p} is missing: run `compare --models {name}` first")
    tool = os.path.join(args.build, "apps", "qbench_torchscript")
    js = os.path.join(out, "latency.json")
    cmd = [tool, "--input", "1,28,28", "--batch", "1,32", "--threads", "1,2", "--runs", str(args.runs),
           "--qengine", "onednn", "--json", js] + sum((["--model", f"{k}={p}"] for k, p in files.items()), [])
    print(name)
    subprocess.run(cmd, check=True)
    with open(js) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("train", "compare", "latency"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default="/tmp/torchvision_vs_torchao")
    ap.add_argument("--models", default="resnet18,mobilenet_v2,vit")
    ap.add_argument("--steps", type=int, default=1200, help="training steps of 128 images")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--budget-s", type=float, default=540, help="train: seconds before a checkpoint")
    ap.add_argument("--calib", type=int, default=256, help="calibration images (both tools)")
    ap.add_argument("--eval", type=int, default=10000, help="test images (all 10 000, or a seeded pick)")
    ap.add_argument("--batch", type=int, default=32, help="calibration batch (both tools)")
    ap.add_argument("--runs", type=int, default=50, help="latency: timed calls per model and cell")
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
