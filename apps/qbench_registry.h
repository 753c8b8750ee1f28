// qbench's registry: each bench file adds cases; every case runs qforge and its LibTorch peer
// (impl "libtorch") or the hardware limit (impl "limit") on the same inputs. The LibTorch impl
// comes first in each case so the ratio column can be printed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace qforge::bench {

struct Impl {
  std::string name;  // "qforge", "libtorch", "limit" or a qforge variant ("qforge-int4")
  std::function<void()> run;
};

struct Case {
  std::string shape;
  double bytes;  // bytes read + written by the work, for GB/s (0: not bandwidth-bound)
  std::vector<Impl> impls;
};

struct Bench {
  int order;  // print order: limits first, then by issue area
  std::string name;
  std::function<std::vector<Case>()> make_cases;
};

std::vector<Bench>& registry();

// Elements of the streaming benches (fake-quant, observers): 16M floats = 64 MiB, well past the
// last-level cache, so every figure is the DRAM regime.
constexpr int64_t kStreamElements = int64_t{1} << 24;

// Registers a bench at static-initialisation time.
struct Register {
  Register(int order, std::string name, std::function<std::vector<Case>()> make) {
    registry().push_back(Bench{order, std::move(name), std::move(make)});
  }
};

}  // namespace qforge::bench
