// The mixed-precision search from an installed qforge (component search): per-layer weight widths
// under a size budget, measured sensitivities and frozen kernel latencies, then the chosen scheme
// applied and frozen; the frozen model's bytes are the ones the search predicted.
#include <qforge/framework/search/search.h>
#include <qforge/qforge.h>

#include <cstdio>
#include <vector>

namespace {

struct Net : torch::nn::Module {
  Net()
      : fc1(register_module("fc1", qforge::nn::Linear(32, 256))),
        fc2(register_module("fc2", qforge::nn::Linear(256, 256))),
        head(register_module("head", qforge::nn::Linear(256, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return head(at::relu(fc2(at::relu(fc1(x))))); }
  qforge::nn::Linear fc1, fc2, head;
};

}  // namespace

int main() {
  at::manual_seed(0);
  auto model = std::make_shared<Net>();
  model->eval();
  std::vector<at::Tensor> x, y;
  for (int b = 0; b < 2; ++b) {
    x.push_back(at::randn({64, 32}));
    y.push_back(at::randint(0, 4, {64}, at::kLong));
  }
  namespace search = qforge::search;
  search::SearchOptions options;
  options.method = search::Method::kLoss;
  options.candidates = {search::Candidate{qforge::qint8, qforge::Granularity::kPerChannel, 0, std::nullopt},
                        search::Candidate{qforge::qint4, qforge::Granularity::kPerGroup, 32, std::nullopt}};
  options.budget.size_ratio = 0.2;  // of the float model's bytes
  options.latency.repeats = 3;
  const qforge::Scheme base(qforge::qint8);
  const search::SearchResult result = search::search(
      *model, base, 2, [&](int64_t b) { return at::cross_entropy_loss(model->forward(x[b]), y[b]); }, options);
  for (const auto& l : result.layers)
    std::printf("%-5s -> %s\n", l.path.c_str(), l.candidates[l.chosen].candidate.c_str());

  qforge::quantize(*model, search::apply(base, result));
  qforge::freeze(*model);
  const int64_t frozen = qforge::model_size(*model).total_bytes;
  std::printf("predicted %lld bytes, frozen %lld bytes, float %lld bytes\n", static_cast<long long>(result.bytes),
              static_cast<long long>(frozen), static_cast<long long>(result.float_bytes));
  const bool ok = frozen == result.bytes && frozen <= 0.2 * result.float_bytes;
  std::printf("%s\n", ok ? "search met the budget and predicted the frozen size" : "FAILED");
  return ok ? 0 : 1;
}
