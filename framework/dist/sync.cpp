// Observer merging, gradient averaging and replica checks over a World (see sync.h).
#include "framework/dist/sync.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstring>
#include <map>

#include "framework/core/error.h"
#include "framework/nn/quantizable.h"

namespace qforge::dist {
namespace {

std::vector<uint8_t> to_bytes(const std::map<std::string, at::Tensor>& state) {
  c10::Dict<std::string, at::Tensor> d;
  for (const auto& [name, t] : state) d.insert(name, t.contiguous());
  const std::vector<char> p = torch::jit::pickle_save(c10::IValue(d));
  return std::vector<uint8_t>(p.begin(), p.end());
}

std::map<std::string, at::Tensor> from_bytes(const std::vector<uint8_t>& bytes, const std::string& who) {
  const c10::IValue v = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  QF_REQUIRE(v.isGenericDict(), "dist: ", who, ": a rank sent an observer state that is not a dictionary");
  std::map<std::string, at::Tensor> out;
  for (const auto& item : v.toGenericDict()) out[item.key().toStringRef()] = item.value().toTensor();
  return out;
}

void fnv1a(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
}

}  // namespace

int64_t sync_observers(torch::nn::Module& model, const World& world) {
  int64_t merged = 0;
  for_each_quantizable(model, [&](const std::string& path, QuantizableLayer& layer) {
    for (Quantizer q : layer.quantizers()) {
      Observer* obs = q->observer();
      if (obs == nullptr) continue;
      const std::string who = path + " " + obs->kind() + " observer";
      if (!world.single()) {
        const auto states = world.all_gather_bytes(to_bytes(obs->state()));
        std::unique_ptr<Observer> all = obs->clone();
        all->load_state(from_bytes(states[0], who));
        for (size_t r = 1; r < states.size(); ++r) {
          std::unique_ptr<Observer> other = obs->clone();
          other->load_state(from_bytes(states[r], who));
          all->merge(*other);
        }
        obs->load_state(all->state());
      }
      ++merged;
    }
  });
  return merged;
}

void average_gradients(torch::nn::Module& model, const World& world, int64_t bucket_bytes) {
  QF_REQUIRE(bucket_bytes > 0, "dist: average_gradients needs bucket_bytes > 0");
  if (world.single()) return;
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : model.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    QF_REQUIRE(p.is_cpu(), "dist: gradients are averaged over Gloo, which needs CPU parameters; got one on ",
               p.device());
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    params.push_back(p);
  }
  const double inv = 1.0 / world.size();
  size_t i = 0;
  while (i < params.size()) {
    // One bucket: consecutive gradients of one dtype up to bucket_bytes (at least one).
    const at::ScalarType dtype = params[i].grad().scalar_type();
    size_t j = i;
    int64_t bytes = 0;
    while (j < params.size() && params[j].grad().scalar_type() == dtype &&
           (j == i || bytes + params[j].grad().nbytes() <= static_cast<size_t>(bucket_bytes))) {
      bytes += static_cast<int64_t>(params[j].grad().nbytes());
      ++j;
    }
    std::vector<at::Tensor> flat;
    for (size_t k = i; k < j; ++k) flat.push_back(params[k].grad().reshape({-1}));
    at::Tensor bucket = at::cat(flat).contiguous();
    world.all_reduce(bucket, Reduce::kSum);
    bucket.mul_(inv);
    int64_t off = 0;
    for (size_t k = i; k < j; ++k) {
      at::Tensor g = params[k].mutable_grad();
      const int64_t n = g.numel();
      g.copy_(bucket.narrow(0, off, n).view_as(g));
      off += n;
    }
    i = j;
  }
}

void broadcast_buffers(torch::nn::Module& model, const World& world, int root) {
  if (world.single()) return;
  for (auto& b : model.named_buffers(/*recurse=*/true)) {
    at::Tensor& t = b.value();
    if (!t.defined()) continue;
    QF_REQUIRE(t.is_cpu(), "dist: buffer ", b.key(), " is on ", t.device(), "; Gloo broadcasts CPU tensors");
    at::Tensor c = t.contiguous();
    world.broadcast(c, root);
    if (!c.is_same(t)) t.copy_(c);
  }
}

uint64_t replica_hash(const torch::nn::Module& model) {
  uint64_t h = 1469598103934665603ULL;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    fnv1a(h, name.data(), name.size());
    if (!t.defined()) return;
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const auto dtype = static_cast<int>(c.scalar_type());
    fnv1a(h, &dtype, sizeof dtype);
    for (const int64_t s : c.sizes()) fnv1a(h, &s, sizeof s);
    fnv1a(h, c.data_ptr(), c.nbytes());
  };
  for (const auto& p : model.named_parameters(/*recurse=*/true)) add(p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true)) add(b.key(), b.value());
  return h;
}

void check_replicas(const torch::nn::Module& model, const World& world, const std::string& when) {
  if (world.single()) return;
  const uint64_t mine = replica_hash(model);
  std::vector<uint8_t> bytes(sizeof mine);
  std::memcpy(bytes.data(), &mine, sizeof mine);
  const auto all = world.all_gather_bytes(bytes);
  std::string differ;
  uint64_t h0 = 0;
  std::memcpy(&h0, all[0].data(), sizeof h0);
  for (size_t r = 1; r < all.size(); ++r) {
    uint64_t hr = 0;
    std::memcpy(&hr, all[r].data(), sizeof hr);
    if (hr != h0) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  }
  QF_REQUIRE(differ.empty(), "dist: ", world.prefix(), ": the model's parameters differ between ranks ", when,
             ": rank(s) ", differ, " hold other values than rank 0 (different seeds, recipes or data order?)");
}

}  // namespace qforge::dist
