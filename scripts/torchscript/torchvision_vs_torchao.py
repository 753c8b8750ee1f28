#!/usr/bin/python3
"""torchvision's ResNet-18 and MobileNetV2 through qforge (TorchScript -> qtrain W8A8 PTQ -> frozen
int8) beside torch.ao's FX post-training quantization of the same float weights, calibrated on the
same images.

    /usr/bin/python3 scripts/torchscript/torchvision_vs_torchao.py --build build --out /tmp/tv_vs_ao

Weights: torchvision's random initialisation (seed 0; no pretrained weights offline), then the
BatchNorm running statistics are reset and set by train-mode forwards (momentum None: the
cumulative average over all BN images) of the BN images (no gradient step),
then eval(). Images: Fashion-MNIST test images (dataset-fashion-mnist, /usr/share/datasets),
a seeded pick, bilinearly resized to 224 x 224, repeated to 3 channels, normalised to [-1, 1].
The BN, calibration and evaluation images are disjoint.

Reported per model, on the evaluation images: logits SQNR against the float model,
10 log10(sum f^2 / sum (f - q)^2) in dB, the same with each model's mean logits over the
evaluation images removed (centered: the input-dependent part), top-1 agreement with the float
model and how many distinct classes the float model's top-1 takes, and the median
latency of one image (batch 1, torch.set_num_threads(1)) of the float model (traced), torch.ao's
converted int8 model (traced) and qforge's frozen int8 TorchScript file (qtrain's model.pt, run
with libqforge_torchscript.so loaded), all in this process through TorchScript, and qtrain's own
C++ latency (float -> frozen, its report.json's latency_ms).
"""
import argparse
import copy
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"


def fashion_images(n, seed):
    """n seeded Fashion-MNIST test images as [n, 3, 224, 224] float32 in [-1, 1]."""
    if not os.path.exists(FASHION):
        sys.exit(f"{FASHION} is missing: apt-get install dataset-fashion-mnist")
    with gzip.open(FASHION, "rb") as f:
        raw = f.read()
    count = int.from_bytes(raw[4:8], "big")
    images = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(count, 28, 28)
    pick = torch.randperm(count, generator=torch.Generator().manual_seed(seed))[:n]
    x = torch.from_numpy(images[pick.numpy()].copy()).float().div(255.0).unsqueeze(1)
    x = torch.nn.functional.interpolate(x, size=(224, 224), mode="bilinear", align_corners=False)
    return ((x - 0.5) / 0.5).repeat(1, 3, 1, 1).contiguous()


def make_model(name, bn_images):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # cumulative average: the statistics of all the BN images, not 10 % per batch
    model.train()
    with torch.no_grad():
        for batch in bn_images.split(16):
            model(batch)  # running statistics only; no parameter changes
    return model.eval()


def sqnr_db(ref, q):
    err = (ref - q).double().pow(2).sum()
    return float("inf") if err == 0 else float(10 * torch.log10(ref.double().pow(2).sum() / err))


def centered_sqnr_db(ref, q):
    """SQNR of the input-dependent part of the logits: each model's mean logit vector over the
    evaluation images removed first (a random-init network answers every image with nearly the
    same logits, which dominate the plain SQNR)."""
    return sqnr_db(ref - ref.mean(0), q - q.mean(0))


def agreement(ref, q):
    return float((ref.argmax(1) == q.argmax(1)).double().mean())


def logits(model, x):
    with torch.no_grad():
        return torch.cat([model(b) for b in x.split(16)])


def latency_ms(model, x, runs):
    with torch.no_grad():
        for _ in range(5):
            model(x)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def torchao_ptq(model, calib, example):
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    engines = torch.backends.quantized.supported_engines
    engine = next(e for e in ("x86", "fbgemm", "onednn", "qnnpack") if e in engines)
    torch.backends.quantized.engine = engine
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping(engine), (example,))
    with torch.no_grad():
        for batch in calib.split(16):
            prepared(batch)
    return convert_fx(prepared), engine


def run_qforge(name, model, calib, evals, args, float_eval):
    """Traces the float model, writes qtrain's data file and recipe, runs qtrain, loads model.pt."""
    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    pt = os.path.join(out, f"{name}.pt")
    torch.jit.trace(model, calib[:1]).save(pt)
    labels = float_eval.argmax(1)
    data = os.path.join(out, "data.safetensors")
    # calibration images first, then the evaluation images (qtrain evaluates the last validation_size)
    write_safetensors(data, {"inputs": torch.cat([calib, evals]),
                             "labels": torch.cat([torch.zeros(len(calib), dtype=torch.long), labels])})
    recipe = os.path.join(out, "recipe.yaml")
    with open(recipe, "w") as f:
        f.write(f"include:\n  - {os.path.join(ROOT, 'configs/schemes/w8a8.yaml')}\nseed: 0\n"
                f"model:\n  torchscript: {pt}\n  input_shape: [3, 224, 224]\n"
                f"data:\n  dataset: tensors\n  file: {data}\n  validation_size: {len(evals)}\n"
                f"  batch_size: {args.batch}\ncalibrate: {{batches: {len(calib) // args.batch}}}\n"
                f"freeze: {{enabled: true}}\n")
    run_dir = os.path.join(out, "run")
    cmd = [os.path.join(args.build, "apps", "qtrain"), "--recipe", recipe, "--out", run_dir]
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if args.quiet else None)
    print(f"{name}: qtrain {time.time() - t0:.0f} s", file=sys.stderr)
    return torch.jit.load(os.path.join(run_dir, "model.pt")).eval(), run_dir


def qtrain_latency_ms(run_dir):
    """qtrain's own C++ batch-1 latency (float, frozen) in ms, from its report.json."""
    path = os.path.join(run_dir, "report.json")
    with open(path) as f:
        report = json.load(f)
    lat = report.get("latency_ms")
    if not isinstance(lat, dict) or "float" not in lat or "frozen" not in lat:
        sys.exit(f"{path} has no latency_ms {{float, frozen}}: qtrain did not measure latency")
    return {"float": float(lat["float"]), "frozen": float(lat["frozen"]), "regime": lat.get("regime")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default="/tmp/torchvision_vs_torchao")
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--bn", type=int, default=64, help="images for the BatchNorm statistics")
    ap.add_argument("--calib", type=int, default=32, help="calibration images (both tools)")
    ap.add_argument("--eval", type=int, default=96, help="evaluation images")
    ap.add_argument("--batch", type=int, default=16, help="qtrain's batch size")
    ap.add_argument("--runs", type=int, default=30, help="timed batch-1 runs per model (median)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    if args.calib % args.batch:
        sys.exit("--calib must be a multiple of --batch")
    lib = os.path.join(args.build, "framework", "jit", "libqforge_torchscript.so")
    if not os.path.exists(lib):
        sys.exit(f"{lib} is missing: build qforge first (cmake --build build)")
    torch.ops.load_library(lib)
    images = fashion_images(args.bn + args.calib + args.eval, seed=0)
    bn, calib, evals = images.split([args.bn, args.calib, args.eval])
    rows = []
    for name in args.models.split(","):
        model = make_model(name, bn)
        f_eval = logits(model, evals)
        ao, engine = torchao_ptq(model, calib, calib[:1])
        ao_eval = logits(ao, evals)
        qf, run_dir = run_qforge(name, model, calib, evals, args, f_eval)
        qf_eval = logits(qf, evals)
        one = evals[:1]
        torch.set_num_threads(1)
        lat = {k: latency_ms(m, one, args.runs) for k, m in
               (("float", torch.jit.trace(model, one)), ("torchao", torch.jit.trace(ao, one)), ("qforge", qf))}
        torch.set_num_threads(os.cpu_count() or 1)
        row = {"model": name, "torchao_engine": engine,
               "sqnr_db": {"torchao": sqnr_db(f_eval, ao_eval), "qforge": sqnr_db(f_eval, qf_eval)},
               "centered_sqnr_db": {"torchao": centered_sqnr_db(f_eval, ao_eval),
                                    "qforge": centered_sqnr_db(f_eval, qf_eval)},
               "float_top1_classes": int(f_eval.argmax(1).unique().numel()),
               "top1_agreement": {"torchao": agreement(f_eval, ao_eval), "qforge": agreement(f_eval, qf_eval)},
               "latency_ms_b1_t1": lat, "qtrain_latency_ms": qtrain_latency_ms(run_dir), "qtrain_out": run_dir}
        torch.save({"float": f_eval, "torchao": ao_eval, "qforge": qf_eval}, os.path.join(args.out, f"{name}_logits.pt"))
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, CPU {cpu}; "
          f"{args.bn} BN / {args.calib} calibration / {args.eval} evaluation images")
    print("| model | SQNR torch.ao / qforge (dB) | centered SQNR torch.ao / qforge (dB) | top-1 agr. torch.ao / "
          "qforge (float top-1 classes) | float ms | torch.ao ms | qforge ms | qtrain C++ float -> frozen ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, c, a, l = r["sqnr_db"], r["centered_sqnr_db"], r["top1_agreement"], r["latency_ms_b1_t1"]
        qt = r["qtrain_latency_ms"]
        print(f"| {r['model']} ({r['torchao_engine']}) | {s['torchao']:.1f} / {s['qforge']:.1f} | "
              f"{c['torchao']:.1f} / {c['qforge']:.1f} | {a['torchao']:.3f} / {a['qforge']:.3f} "
              f"({r['float_top1_classes']}) | {l['float']:.1f} | {l['torchao']:.1f} | {l['qforge']:.1f} | "
              f"{qt['float']:.1f} -> {qt['frozen']:.1f} |")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
