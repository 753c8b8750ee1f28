"""Golden qparams: ObserverBase._calculate_qparams for many (min, max, dtype, qscheme) cases."""
import warnings

import torch
from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver

from golden_util import tensor_json, write

torch.manual_seed(1234)
warnings.filterwarnings("ignore", message=".*reduce_range will be deprecated.*")


def case(name, mn, mx, qtype, symmetric, per_channel, reduce_range=False):
    dtype = {"qint8": torch.qint8, "quint8": torch.quint8}[qtype]
    if per_channel:
        qscheme = torch.per_channel_symmetric if symmetric else torch.per_channel_affine
        obs = PerChannelMinMaxObserver(ch_axis=0, dtype=dtype, qscheme=qscheme, reduce_range=reduce_range)
    else:
        qscheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
        obs = MinMaxObserver(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range)
    scale, zp = obs._calculate_qparams(mn, mx)
    return {
        "name": name, "qtype": qtype, "symmetric": symmetric, "per_channel": per_channel,
        "reduce_range": reduce_range,
        "min": tensor_json(mn), "max": tensor_json(mx),
        "scale": tensor_json(scale.to(torch.float32)), "zero_point": tensor_json(zp.to(torch.int64)),
    }


ranges = {
    "mixed": (-1.7, 2.3), "positive": (0.3, 5.1), "negative": (-4.2, -0.1), "tiny": (-1e-9, 2e-9),
    "zero": (0.0, 0.0), "wide": (-3.4e4, 1.2e5), "odd": (-0.1234567, 0.987654321),
}
cases = []
for rname, (lo, hi) in ranges.items():
    for qtype in ("qint8", "quint8"):
        for symmetric in (False, True):
            for reduce_range in (False, True):
                if qtype == "quint8" and symmetric and reduce_range:
                    continue  # PyTorch refuses this combination
                cases.append(case(f"{rname}/{qtype}/{'sym' if symmetric else 'aff'}/rr{int(reduce_range)}",
                                  torch.tensor(lo, dtype=torch.float32), torch.tensor(hi, dtype=torch.float32),
                                  qtype, symmetric, False, reduce_range))
# Per-channel: random ranges including channels that are all positive, all negative or constant.
mn = torch.cat([torch.randn(13) * 3 - 1, torch.tensor([0.5, -2.0, 0.0])]).to(torch.float32)
mx = torch.cat([mn[:13] + torch.rand(13) * 4, torch.tensor([0.5, -1.0, 0.0])]).to(torch.float32)
for qtype in ("qint8", "quint8"):
    for symmetric in (False, True):
        cases.append(case(f"per_channel/{qtype}/{'sym' if symmetric else 'aff'}", mn, mx, qtype, symmetric, True))
write("qparams.json", {"torch_version": torch.__version__, "cases": cases})
