// Observer merging, gradient averaging and replica checks over a World (see sync.h).
#include "framework/dist/sync.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <sstream>

#include "framework/api/kv_cache_scheme.h"
#include "framework/api/kv_static_scales.h"
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
  // A static KV cache being calibrated: its ranges are a min / max per head and group (and a token count).
  for (const auto& [path, m] : kv_cache_models(model)) {
    const std::shared_ptr<KvRangeObserver>& obs = m->kv_cache_scheme().observer;
    if (obs == nullptr) continue;
    if (!world.single()) {
      for (int64_t l = 0; l < m->kv_cache_layers(); ++l)
        for (bool values : {false, true}) {
          world.all_reduce(obs->lo(l, values), Reduce::kMin);
          world.all_reduce(obs->hi(l, values), Reduce::kMax);
        }
      world.all_reduce(obs->seen(), Reduce::kSum);
    }
    ++merged;
  }
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

struct GradientAverager::Bucket {
  at::Tensor flat;               // the gradients of its parameters, concatenated
  std::vector<size_t> params;    // indices into params_
  std::vector<bool> seen;        // per entry of params: backward delivered it this step
  size_t pending = 0;            // entries not delivered yet
  std::function<void()> wait;    // set once started
};

GradientAverager::GradientAverager(torch::nn::Module& model, const World& world, int64_t bucket_bytes)
    : world_(world) {
  QF_REQUIRE(bucket_bytes > 0, "dist: GradientAverager needs bucket_bytes > 0");
  for (const at::Tensor& p : model.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    QF_REQUIRE(p.is_cpu(), "dist: gradients are averaged over Gloo, which needs CPU parameters; got one on ",
               p.device());
    params_.push_back(p);
  }
  where_.resize(params_.size());
  // Reverse registration order, consecutive parameters of one dtype up to bucket_bytes each.
  size_t i = params_.size();
  while (i > 0) {
    auto b = std::make_unique<Bucket>();
    const at::ScalarType dtype = params_[i - 1].scalar_type();
    int64_t numel = 0, bytes = 0;
    // The first bucket is small (1 MiB at most, as DDP's), so an all-reduce starts early in backward.
    const int64_t cap = buckets_.empty() ? std::min<int64_t>(bucket_bytes, int64_t{1} << 20) : bucket_bytes;
    while (i > 0 && params_[i - 1].scalar_type() == dtype &&
           (b->params.empty() || bytes + static_cast<int64_t>(params_[i - 1].nbytes()) <= cap)) {
      --i;
      where_[i] = {buckets_.size(), numel};
      b->params.push_back(i);
      numel += params_[i].numel();
      bytes += static_cast<int64_t>(params_[i].nbytes());
    }
    b->flat = at::zeros({numel}, params_[b->params.front()].options().requires_grad(false));
    b->seen.assign(b->params.size(), false);
    b->pending = b->params.size();
    buckets_.push_back(std::move(b));
  }
  if (world_.single()) return;
  for (size_t k = 0; k < params_.size(); ++k)
    hooks_.push_back(params_[k].register_hook([this, k](const at::Tensor& grad) { ready(k, grad); }));
}

GradientAverager::~GradientAverager() {
  for (size_t k = 0; k < hooks_.size(); ++k) params_[k].remove_hook(hooks_[k]);
}

void GradientAverager::ready(size_t param, const at::Tensor& grad) {
  const auto [b, offset] = where_[param];
  Bucket& bucket = *buckets_[b];
  if (bucket.wait) return;  // already started (a second backward in one step is not averaged)
  const size_t entry = static_cast<size_t>(
      std::find(bucket.params.begin(), bucket.params.end(), param) - bucket.params.begin());
  bucket.flat.narrow(0, offset, params_[param].numel()).copy_(grad.reshape({-1}));
  if (!bucket.seen[entry]) {
    bucket.seen[entry] = true;
    --bucket.pending;
  }
  launch_ready();
}

void GradientAverager::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->pending == 0) {
    Bucket& b = *buckets_[next_launch_++];
    b.wait = world_.all_reduce_async(b.flat, Reduce::kSum);
  }
}

void GradientAverager::finish() {
  if (world_.single()) return;
  last_overlapped_ = static_cast<int64_t>(next_launch_);
  // Parameters backward did not reach: zeros, so every rank reduces the same buckets.
  for (auto& b : buckets_) {
    for (size_t e = 0; e < b->params.size(); ++e) {
      if (b->seen[e]) continue;
      const size_t k = b->params[e];
      b->flat.narrow(0, where_[k].second, params_[k].numel()).zero_();
      b->seen[e] = true;
    }
    b->pending = 0;
  }
  launch_ready();
  const auto t0 = std::chrono::steady_clock::now();
  const double inv = 1.0 / world_.size();
  std::exception_ptr failed;
  for (auto& b : buckets_) {
    try {
      b->wait();
    } catch (...) {
      failed = std::current_exception();  // the group is broken: the other buckets are dropped
      break;
    }
  }
  last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Ready for the next step whatever happened.
  next_launch_ = 0;
  for (auto& b : buckets_) {
    b->wait = nullptr;
    b->seen.assign(b->params.size(), false);
    b->pending = b->params.size();
  }
  if (failed) std::rethrow_exception(failed);
  for (auto& b : buckets_) {
    b->flat.mul_(inv);
    for (size_t k : b->params) {
      at::Tensor p = params_[k];
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      p.mutable_grad().copy_(b->flat.narrow(0, where_[k].second, p.numel()).view_as(p));
    }
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

void broadcast_observers(torch::nn::Module& model, const World& world, int root) {
  if (world.single()) return;
  for_each_quantizable(model, [&](const std::string& path, QuantizableLayer& layer) {
    for (Quantizer q : layer.quantizers()) {
      Observer* obs = q->observer();
      if (obs == nullptr) continue;
      const auto bytes = world.broadcast_bytes(world.rank() == root ? to_bytes(obs->state()) : std::vector<uint8_t>{},
                                               root);
      if (world.rank() != root) obs->load_state(from_bytes(bytes, path + " " + obs->kind() + " observer"));
    }
  });
}

namespace {
// Where two values differ: the whole values when short and on one line, else the first line
// that differs in each (with its number).
std::string first_difference(const std::string& a, const std::string& b, int rank) {
  if (a.find('\n') == std::string::npos && b.find('\n') == std::string::npos && a.size() + b.size() < 400)
    return detail::str_cat("rank 0 has ", a, "; rank ", rank, " has ", b);
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  for (int line = 1;; ++line) {
    const bool ga = static_cast<bool>(std::getline(sa, la)), gb = static_cast<bool>(std::getline(sb, lb));
    if (!ga) la = "(end)";
    if (!gb) lb = "(end)";
    if (la != lb || (!ga && !gb))
      return detail::str_cat("line ", line, ": rank 0 has '", la, "'; rank ", rank, " has '", lb, "'");
  }
}
}  // namespace

void check_agreement(const World& world, const std::string& what, const std::string& value) {
  if (world.single()) return;
  const auto all = world.all_gather_bytes(std::vector<uint8_t>(value.begin(), value.end()));
  const std::string v0(all[0].begin(), all[0].end());
  std::string differ;
  for (size_t r = 1; r < all.size(); ++r) {
    const std::string vr(all[r].begin(), all[r].end());
    if (vr != v0) differ += (differ.empty() ? "" : "; ") + first_difference(v0, vr, static_cast<int>(r));
  }
  QF_REQUIRE(differ.empty(), "dist: ", world.prefix(), ": ", what, " differs between ranks: ", differ,
             " (every rank must run the same program, recipe, overrides and files)");
}

namespace {

constexpr char kFieldSep = '\x1f', kRecordSep = '\x1e';

void hash_tensor(uint64_t& h, const at::Tensor& t) {
  if (!t.defined()) return fnv1a(h, "undefined", 9);
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  const auto dtype = static_cast<int>(c.scalar_type());
  fnv1a(h, &dtype, sizeof dtype);
  for (const int64_t s : c.sizes()) fnv1a(h, &s, sizeof s);
  fnv1a(h, c.data_ptr(), c.nbytes());
}

std::string hex_of(uint64_t h) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "hash %016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string hash_of(const std::vector<at::Tensor>& ts) {
  uint64_t h = 1469598103934665603ULL;
  for (const at::Tensor& t : ts) hash_tensor(h, t);
  return hex_of(h);
}

std::string settings_of(const QuantizerImpl& q) {
  const QuantizerConfig& c = q.config();
  std::string s = c.spec.to_string() + (c.spec.reduce_range ? " reduce_range" : "") +
                  (c.spec.narrow_range ? " narrow_range" : "") + "; mode " + to_string(q.mode());
  if (q.observer() != nullptr) s += "; observer " + q.observer()->kind();
  s += detail::str_cat("; lsq ", c.lsq, ", calibrated ", q.calibrated(), ", observing ", q.observing(),
                       ", fake_quant ", q.fake_quant(), ", observer_frozen ", q.observer_frozen());
  return s;
}

void add_layer_fields(const std::string& path, const QuantizableLayer& layer, std::vector<ReplicaField>& out) {
  const LayerReport rep = layer.report();
  out.push_back({path, "scheme", "weights " + rep.weights + "; activations " + rep.activations});
  out.push_back({path, "kernel", rep.kernel + (layer.frozen() ? " (frozen)" : "")});
  for (const Quantizer& q : layer.quantizers()) {
    const std::string who = q->role() == QuantizerImpl::Role::kWeight ? "weight quantizer" : "activation quantizer";
    out.push_back({path, who + " settings", settings_of(*q)});
    std::vector<at::Tensor> qparams;
    for (const auto& t : q->named_parameters(/*recurse=*/false)) qparams.push_back(t.value());
    for (const auto& t : q->named_buffers(/*recurse=*/false)) qparams.push_back(t.value());
    qparams.push_back(q->codebook());
    out.push_back({path, who + " qparams", hash_of(qparams)});
    if (const Observer* obs = q->observer()) {
      std::vector<at::Tensor> state;
      for (const auto& [name, t] : obs->state()) state.push_back(t);
      out.push_back({path, who + " observer state", hash_of(state)});
    }
  }
  if (!layer.frozen()) return;
  const QuantizedTensor w = layer.frozen_weight();
  if (w.defined())
    out.push_back({path, "frozen weight", w.spec.to_string() + "; " + hash_of({w.data, w.scale, w.zero_point, w.codebook,
                                                                                 w.tensor_scale})});
  out.push_back({path, "frozen bias", hash_of({layer.frozen_bias()})});
}

std::string serialize(const std::vector<ReplicaField>& fields) {
  std::string out;
  for (const ReplicaField& f : fields) out += f.where + kFieldSep + f.what + kFieldSep + f.value + kRecordSep;
  return out;
}

std::vector<ReplicaField> deserialize(const std::vector<uint8_t>& bytes) {
  std::vector<ReplicaField> out;
  std::string rec;
  for (const uint8_t b : bytes) {
    if (b != static_cast<uint8_t>(kRecordSep)) {
      rec += static_cast<char>(b);
      continue;
    }
    const size_t a = rec.find(kFieldSep), z = rec.find(kFieldSep, a + 1);
    QF_REQUIRE(a != std::string::npos && z != std::string::npos, "dist: a rank sent a malformed replica field");
    out.push_back({rec.substr(0, a), rec.substr(a + 1, z - a - 1), rec.substr(z + 1)});
    rec.clear();
  }
  return out;
}

// "rank 1 first differs at fc1, weight quantizer settings: rank 0 has '…', rank 1 has '…'".
std::string first_field_difference(const std::vector<ReplicaField>& r0, const std::vector<ReplicaField>& rr, int rank) {
  for (size_t i = 0; i < std::max(r0.size(), rr.size()); ++i) {
    const ReplicaField none{"(nothing)", "(nothing)", "(nothing)"};
    const ReplicaField& a = i < r0.size() ? r0[i] : none;
    const ReplicaField& b = i < rr.size() ? rr[i] : none;
    if (a.where == b.where && a.what == b.what && a.value == b.value) continue;
    if (a.where == b.where && a.what == b.what)
      return detail::str_cat("rank ", rank, " first differs at ", a.where, ", ", a.what, ": rank 0 has '", a.value,
                             "', rank ", rank, " has '", b.value, "'");
    return detail::str_cat("rank ", rank, " first differs at ", a.where, ", ", a.what, " on rank 0 against ", b.where,
                           ", ", b.what, " on rank ", rank);
  }
  return detail::str_cat("rank ", rank, " has the same fields under another hash");
}

}  // namespace

std::vector<ReplicaField> replica_fields(const torch::nn::Module& model) {
  std::vector<ReplicaField> out;
  for_each_quantizable(model, [&](const std::string& path, const QuantizableLayer& layer) {
    add_layer_fields(path, layer, out);
  });
  for (const auto& p : model.named_parameters(/*recurse=*/true)) out.push_back({p.key(), "parameter", hash_of({p.value()})});
  for (const auto& b : model.named_buffers(/*recurse=*/true)) out.push_back({b.key(), "buffer", hash_of({b.value()})});
  return out;
}

uint64_t replica_hash(const torch::nn::Module& model) {
  uint64_t h = 1469598103934665603ULL;
  const std::string all = serialize(replica_fields(model));
  fnv1a(h, all.data(), all.size());
  return h;
}

void check_replicas(const torch::nn::Module& model, const World& world, const std::string& when) {
  if (world.single()) return;
  const std::vector<ReplicaField> fields = replica_fields(model);
  uint64_t mine = 1469598103934665603ULL;
  const std::string text = serialize(fields);
  fnv1a(mine, text.data(), text.size());
  std::vector<uint8_t> bytes(sizeof mine);
  std::memcpy(bytes.data(), &mine, sizeof mine);
  const auto all = world.all_gather_bytes(bytes);
  std::vector<int> differ;
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differ.push_back(static_cast<int>(r));
  if (differ.empty()) return;
  // Every rank saw the same hashes, so every rank gathers the fields too: none is left waiting.
  const auto texts = world.all_gather_bytes(std::vector<uint8_t>(text.begin(), text.end()));
  const std::vector<ReplicaField> r0 = deserialize(texts[0]);
  std::string ranks, where;
  for (const int r : differ) {
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    where += (where.empty() ? "" : "; ") + first_field_difference(r0, deserialize(texts[r]), r);
  }
  throw Error(detail::str_cat("dist: ", world.prefix(), ": the model differs between ranks ", when, ": rank(s) ", ranks,
                              " hold other values than rank 0: ", where,
                              " (different seeds, recipes, data order or per-rank decisions?)"));
}

}  // namespace qforge::dist
