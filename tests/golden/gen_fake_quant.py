"""Golden fake-quant vectors: ATen's fake_quantize_per_tensor_affine / _per_channel_affine
(forward and STE gradient) and the learnable (LSQ) ops' forward and all three gradients."""
import torch

from golden_util import data_kinds, tensor_json, write

torch.manual_seed(7)
gen = torch.Generator().manual_seed(7)

GRIDS = {"qint8": (-128, 127), "quint8": (0, 255), "qint4": (-8, 7), "quint4": (0, 15), "qint3": (-4, 3), "qint2": (-2, 1)}


def ties(scale, n=64):
    """Values exactly halfway between grid points, to pin round-half-to-even."""
    k = torch.arange(-n // 2, n // 2, dtype=torch.float32)
    return ((k + 0.5) * scale).to(torch.float32)


def per_tensor_cases():
    out = []
    for kind, x in data_kinds(gen, (300,)).items():
        for grid, (qmin, qmax) in GRIDS.items():
            amax = float(x.abs().max())
            scale = (2 * amax / (qmax - qmin)) * 0.8 if amax > 0 else 0.1  # 0.8: some values clip
            zp = (qmin + qmax + 1) // 2 if qmin == 0 else 0
            if grid == "quint8":
                zp = 77  # an off-centre zero point
            xs = torch.cat([x, ties(scale)])
            xr = xs.clone().requires_grad_(True)
            y = torch.fake_quantize_per_tensor_affine(xr, scale, zp, qmin, qmax)
            dy = torch.randn(xs.shape, generator=gen)
            y.backward(dy)
            out.append({"name": f"{kind}/{grid}", "scale": float(torch.tensor(scale, dtype=torch.float32)),
                        "zero_point": zp, "quant_min": qmin, "quant_max": qmax,
                        "x": tensor_json(xs), "dy": tensor_json(dy), "y": tensor_json(y), "dx": tensor_json(xr.grad)})
    return out


def per_channel_cases():
    out = []
    shapes = [((12, 20), 0), ((2, 5, 3, 6), 1), ((3, 7, 17), 2), ((17,), 0)]
    for shape, axis in shapes:
        for grid in ("qint8", "quint8", "qint4"):
            qmin, qmax = GRIDS[grid]
            x = torch.randn(shape, generator=gen) * 2.0
            C = shape[axis]
            scale = (torch.rand(C, generator=gen) * 0.05 + 0.01).to(torch.float32)
            zp = torch.randint(qmin, qmax + 1, (C,), generator=gen).to(torch.int32)
            xr = x.clone().requires_grad_(True)
            y = torch.fake_quantize_per_channel_affine(xr, scale, zp, axis, qmin, qmax)
            dy = torch.randn(shape, generator=gen)
            y.backward(dy)
            out.append({"name": f"{list(shape)}/axis{axis}/{grid}", "axis": axis, "quant_min": qmin, "quant_max": qmax,
                        "scale": tensor_json(scale), "zero_point": tensor_json(zp),
                        "x": tensor_json(x), "dy": tensor_json(dy), "y": tensor_json(y), "dx": tensor_json(xr.grad)})
    return out


def lsq_cases():
    out = []
    for kind, x in data_kinds(gen, (256,)).items():
        for grid in ("qint8", "quint8", "qint4"):
            qmin, qmax = GRIDS[grid]
            for zp_val in (0.0, 2.5, -3.7 if qmin < 0 else 5.4):
                scale = torch.tensor([max(float(x.abs().mean()) * 2 / qmax ** 0.5, 1e-3)], requires_grad=True)
                zp = torch.tensor([zp_val], requires_grad=True)
                xr = x.clone().requires_grad_(True)
                gf = 1.0 / (x.numel() * qmax) ** 0.5
                y = torch._fake_quantize_learnable_per_tensor_affine(xr, scale, zp, qmin, qmax, gf)
                dy = torch.randn(x.shape, generator=gen)
                y.backward(dy)
                out.append({"name": f"per_tensor/{kind}/{grid}/zp{zp_val}", "per_channel": False, "axis": 0,
                            "quant_min": qmin, "quant_max": qmax, "grad_factor": gf,
                            "scale": tensor_json(scale.detach()), "zero_point": tensor_json(zp.detach()),
                            "x": tensor_json(x), "dy": tensor_json(dy), "y": tensor_json(y),
                            "dx": tensor_json(xr.grad), "dscale": tensor_json(scale.grad),
                            "dzero_point": tensor_json(zp.grad)})
    for shape, axis in [((8, 33), 0), ((2, 6, 3, 5), 1), ((3, 5, 16), 2)]:
        for grid in ("qint8", "quint4"):
            qmin, qmax = GRIDS[grid]
            x = torch.randn(shape, generator=gen)
            C = shape[axis]
            scale = (torch.rand(C, generator=gen) * 0.1 + 0.02).requires_grad_(True)
            zp = (torch.rand(C, generator=gen) * 6 - 3 + (qmin + qmax) / 2).requires_grad_(True)
            xr = x.clone().requires_grad_(True)
            gf = 1.0 / (x.numel() / C * qmax) ** 0.5
            y = torch._fake_quantize_learnable_per_channel_affine(xr, scale, zp, axis, qmin, qmax, gf)
            dy = torch.randn(shape, generator=gen)
            y.backward(dy)
            out.append({"name": f"per_channel/{list(shape)}/axis{axis}/{grid}", "per_channel": True, "axis": axis,
                        "quant_min": qmin, "quant_max": qmax, "grad_factor": gf,
                        "scale": tensor_json(scale.detach()), "zero_point": tensor_json(zp.detach()),
                        "x": tensor_json(x), "dy": tensor_json(dy), "y": tensor_json(y),
                        "dx": tensor_json(xr.grad), "dscale": tensor_json(scale.grad),
                        "dzero_point": tensor_json(zp.grad)})
    return out


write("fake_quant.json", {"torch_version": torch.__version__, "per_tensor": per_tensor_cases(),
                          "per_channel": per_channel_cases()})
write("lsq.json", {"torch_version": torch.__version__, "cases": lsq_cases()})
