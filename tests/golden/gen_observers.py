"""Golden observers: torch.ao.quantization observers (PyTorch 1.13) over several batches.

Writes observers_minmax.json (MinMax, MovingAverageMinMax, PerChannelMinMax,
MovingAveragePerChannelMinMax) and observers_histogram.json (HistogramObserver), each case with
its input batches, the state after every batch and the final qparams for qint8/quint8 x
affine/symmetric.

HistogramObserver in PyTorch 1.13 passes int(min_val)/int(max_val) to torch.histc, which drops
values outside the truncated range (fixed in later PyTorch). qforge bins on the float range, so
the oracle here is HistogramObserver with only that call changed (FloatRangeHistogramObserver);
the "stock_integer_range" case, whose ranges are integers, checks that stock PyTorch agrees.
"""
import warnings

import torch
from torch.ao.quantization.observer import (HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver,
                                            MovingAveragePerChannelMinMaxObserver, PerChannelMinMaxObserver)

from golden_util import data_kinds, tensor_json, write

warnings.filterwarnings("ignore")
torch.manual_seed(20240601)
GEN = torch.Generator().manual_seed(7)

QTYPES = {"qint8": torch.qint8, "quint8": torch.quint8}
# Batch scales: the range grows, grows again, then a batch falls inside it.
BATCH_SCALES = (1.0, 1.7, 2.9, 0.5)


class FloatRangeHistogramObserver(HistogramObserver):
    """HistogramObserver.forward from PyTorch 1.13 with histc(min=float, max=float)."""

    def forward(self, x_orig):
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach()
        min_val = self.min_val
        max_val = self.max_val
        same_values = min_val.item() == max_val.item()
        is_uninitialized = min_val == float("inf") and max_val == float("-inf")
        if is_uninitialized or same_values:
            min_val, max_val = torch.aminmax(x)
            self.min_val.resize_(min_val.shape)
            self.min_val.copy_(min_val)
            self.max_val.resize_(max_val.shape)
            self.max_val.copy_(max_val)
            torch.histc(x, self.bins, min=float(min_val), max=float(max_val), out=self.histogram)
        else:
            new_min, new_max = torch.aminmax(x)
            combined_min = torch.min(new_min, min_val)
            combined_max = torch.max(new_max, max_val)
            (combined_min, combined_max, downsample_rate, start_idx) = self._adjust_min_max(
                combined_min, combined_max, self.upsample_rate)
            combined_histogram = torch.histc(x, self.bins, min=float(combined_min), max=float(combined_max))
            if combined_min == min_val and combined_max == max_val:
                combined_histogram += self.histogram
            else:
                combined_histogram = self._combine_histograms(
                    combined_histogram, self.histogram, self.upsample_rate, downsample_rate, start_idx,
                    self.bins)
            self.histogram.detach_().resize_(combined_histogram.shape)
            self.histogram.copy_(combined_histogram)
            self.min_val.detach_().resize_(combined_min.shape)
            self.min_val.copy_(combined_min)
            self.max_val.detach_().resize_(combined_max.shape)
            self.max_val.copy_(combined_max)
        return x_orig


def batches_of(kind, shape, n):
    """n batches of one data kind, rescaled so the range changes from batch to batch."""
    out = []
    for b in range(n):
        x = data_kinds(GEN, shape)[kind]
        if kind != "constant":
            x = x * BATCH_SCALES[b % len(BATCH_SCALES)]
        out.append(x.to(torch.float32))
    return out


def qparams_json(obs_factory, min_val, max_val):
    """Final qparams for the four dtype x scheme combinations, via _calculate_qparams."""
    out = {}
    for qname, dtype in QTYPES.items():
        for sym in (False, True):
            obs = obs_factory(dtype, sym)
            scale, zp = obs._calculate_qparams(min_val, max_val)
            out[f"{qname}/{'symmetric' if sym else 'affine'}"] = {
                "scale": tensor_json(scale.to(torch.float32)), "zero_point": tensor_json(zp.to(torch.int64))}
    return out


def run_minmax_cases():
    cases = []
    for kind in ("normal", "skewed", "heavy_tailed", "constant"):
        batches = batches_of(kind, (4, 16), 3)
        specs = [
            ("minmax", lambda d, s: MinMaxObserver(dtype=d, qscheme=torch.per_tensor_symmetric if s else torch.per_tensor_affine), {}),
            ("moving_average_minmax", lambda d, s: MovingAverageMinMaxObserver(
                dtype=d, qscheme=torch.per_tensor_symmetric if s else torch.per_tensor_affine), {"averaging_constant": 0.01}),
            ("moving_average_minmax", lambda d, s: MovingAverageMinMaxObserver(
                averaging_constant=0.25, dtype=d, qscheme=torch.per_tensor_symmetric if s else torch.per_tensor_affine),
             {"averaging_constant": 0.25}),
        ]
        for axis in (0, 1):
            specs.append(("per_channel_minmax", lambda d, s, a=axis: PerChannelMinMaxObserver(
                ch_axis=a, dtype=d, qscheme=torch.per_channel_symmetric if s else torch.per_channel_affine),
                {"ch_axis": axis}))
            specs.append(("moving_average_per_channel_minmax", lambda d, s, a=axis: MovingAveragePerChannelMinMaxObserver(
                averaging_constant=0.25, ch_axis=a, dtype=d,
                qscheme=torch.per_channel_symmetric if s else torch.per_channel_affine),
                {"ch_axis": axis, "averaging_constant": 0.25}))
        for name, factory, options in specs:
            obs = factory(torch.quint8, False)
            states = []
            for x in batches:
                obs(x)
                states.append({"min": tensor_json(obs.min_val), "max": tensor_json(obs.max_val)})
            cases.append({
                "name": f"{name}/{kind}/{options}", "kind": name, "data_kind": kind, "options": options,
                "batches": [tensor_json(x) for x in batches], "states": states,
                "qparams": qparams_json(factory, obs.min_val, obs.max_val)})
    return cases


def histogram_case(name, kind, batches, cls=FloatRangeHistogramObserver):
    obs = cls(dtype=torch.quint8, qscheme=torch.per_tensor_affine)
    states = []
    for x in batches:
        obs(x)
        states.append({"min": tensor_json(obs.min_val), "max": tensor_json(obs.max_val),
                       "histogram_sum": float(obs.histogram.sum())})
    final = {"min": tensor_json(obs.min_val), "max": tensor_json(obs.max_val), "histogram": tensor_json(obs.histogram)}
    if obs.min_val.item() == obs.max_val.item():
        # Zero bin width: the search cannot move, new_min = new_max = min_val (PyTorch loops 1e5
        # times to find that out, too slow for a generator).
        search_min, search_max = obs.min_val.clone(), obs.max_val.clone()
    else:
        search_min, search_max = obs._non_linear_param_search()
    qps = {}
    for qname, dtype in QTYPES.items():
        for sym in (False, True):
            o = cls(dtype=dtype, qscheme=torch.per_tensor_symmetric if sym else torch.per_tensor_affine)
            scale, zp = o._calculate_qparams(search_min, search_max)
            qps[f"{qname}/{'symmetric' if sym else 'affine'}"] = {
                "scale": tensor_json(scale.to(torch.float32)), "zero_point": tensor_json(zp.to(torch.int64))}
    return {"name": name, "data_kind": kind, "batches": [tensor_json(x) for x in batches], "states": states,
            "final": final, "search_min": tensor_json(search_min), "search_max": tensor_json(search_max),
            "qparams": qps}


def run_histogram_cases():
    cases = []
    for kind in ("normal", "skewed", "heavy_tailed", "constant"):
        cases.append(histogram_case(f"histogram/{kind}", kind, batches_of(kind, (384,), 4)))
    # Integer-valued ranges: stock PyTorch 1.13 (int() range) and the float-range oracle agree.
    base = torch.randn(256, generator=GEN).clamp(-3.5, 3.5)
    first = torch.cat([base, torch.tensor([-4.0, 4.0])])
    batches = [first, torch.randn(200, generator=GEN).clamp(-3.9, 3.9), torch.rand(100, generator=GEN) * 6 - 3]
    stock = histogram_case("histogram/stock_integer_range", "normal", batches, HistogramObserver)
    fixed = histogram_case("histogram/stock_integer_range", "normal", batches)
    assert stock == fixed, "stock and float-range HistogramObserver differ on integer ranges"
    cases.append(stock)
    return cases


write("observers_minmax.json", {"torch_version": torch.__version__, "cases": run_minmax_cases()})
write("observers_histogram.json", {"torch_version": torch.__version__, "bins": 2048, "upsample_rate": 128,
                                   "cases": run_histogram_cases()})
