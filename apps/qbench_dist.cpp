// qbench_dist: data-parallel QAT throughput of the Fashion-MNIST CNN (W8A8: int8 per-channel
// weights, static int8 activations) over c10d, one process or several under torchrun:
//   build/apps/qbench_dist --threads 1
//   torchrun --no-python --nproc_per_node 2 build/apps/qbench_dist --threads 1
// Every rank trains on its own random batches (per-rank batch --batch); gradients are averaged
// over the ranks after every backward (dist::average_gradients), or with --overlap during
// backward (dist::GradientAverager, the buckets that are full start on Gloo's thread); the time
// spent averaging after backward (waiting included) is measured apart;
// BatchNorm statistics are broadcast from rank 0 before each replica check.
// Rank 0 prints examples/s over all ranks, steps/s, and the all-reduce's share of a step.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>

#include "apps/elapsed.h"
#include "framework/dist/sync.h"
#include "framework/dist/world.h"
#include "framework/models/cnn.h"
#include "framework/api/quantize.h"

namespace {

using Clock = std::chrono::steady_clock;

using qforge::apps::seconds_since;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qbench_dist: data-parallel QAT steps/s over c10d (run under torchrun for several ranks)"};
  int64_t steps = 60, warmup = 5, batch = 64;
  int threads = 1;
  bool json = false, overlap = false;
  app.add_option("--steps", steps, "timed QAT steps per rank")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", batch, "examples per rank and step")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "intra-op threads per process")->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "one JSON line instead of the table");
  app.add_flag("--overlap", overlap, "all-reduce buckets during backward (GradientAverager)");
  double bucket_mib = 25;
  app.add_option("--bucket-mib", bucket_mib, "gradient bucket size in MiB")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    at::set_num_threads(threads);
    const qforge::dist::World world = qforge::dist::World::from_env();
    torch::manual_seed(0);  // the same initial model on every rank
    qforge::models::SmallCnn model;
    qforge::Scheme scheme(qforge::qint8);
    scheme.activations = qforge::ActivationMode::kStatic;
    scheme.observer = "minmax";
    qforge::quantize(model, scheme);
    torch::manual_seed(1000 + world.rank());  // each rank its own data
    {
      qforge::Calibration calib(model);
      for (int i = 0; i < 4; ++i) model->forward(at::randn({batch, 1, 28, 28}));
      qforge::dist::sync_observers(*model, world);
    }
    qforge::dist::broadcast_buffers(*model, world);  // BatchNorm statistics of rank 0's batches
    qforge::dist::check_replicas(*model, world, "at start");
    std::unique_ptr<qforge::dist::GradientAverager> averager;
    const auto bucket_bytes = static_cast<int64_t>(bucket_mib * (1 << 20));
    if (overlap) averager = std::make_unique<qforge::dist::GradientAverager>(*model, world, bucket_bytes);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    model->train();
    double reduce_s = 0;
    Clock::time_point t0;
    for (int64_t s = 0; s < warmup + steps; ++s) {
      if (s == warmup) {
        world.barrier();
        t0 = Clock::now();
        reduce_s = 0;
      }
      const at::Tensor x = at::randn({batch, 1, 28, 28});
      const at::Tensor y = at::randint(0, 10, {batch}, at::kLong);
      opt.zero_grad();
      at::cross_entropy_loss(model->forward(x), y).backward();
      const auto r0 = Clock::now();
      if (averager)
        averager->finish();
      else
        qforge::dist::average_gradients(*model, world, bucket_bytes);
      reduce_s += seconds_since(r0);
      opt.step();
    }
    world.barrier();
    const double total = seconds_since(t0);
    qforge::dist::broadcast_buffers(*model, world);  // BatchNorm statistics, as DDP does
    qforge::dist::check_replicas(*model, world, "after the run");
    at::Tensor red = at::full({1}, reduce_s, at::kDouble);
    world.all_reduce(red, qforge::dist::Reduce::kMax);
    if (world.rank() == 0) {
      const double examples = static_cast<double>(steps * batch * world.size());
      if (json) {
        std::printf("{\"bench\": \"qat_dp_cnn\", \"world_size\": %d, \"threads\": %d, \"batch_per_rank\": %lld, "
                    "\"overlap\": %s, \"bucket_mib\": %.3g, \"steps\": %lld, \"seconds\": %.4f, \"examples_per_s\": %.1f, \"steps_per_s\": %.3f, "
                    "\"allreduce_ms_per_step\": %.3f}\n",
                    world.size(), threads, static_cast<long long>(batch), overlap ? "true" : "false", bucket_mib,
                    static_cast<long long>(steps), total,
                    examples / total, steps / total, 1e3 * red.item<double>() / steps);
      } else {
        std::printf("qbench_dist: SmallCnn W8A8 QAT, %d rank(s) x %d thread(s), batch %lld per rank, %lld steps%s\n",
                    world.size(), threads, static_cast<long long>(batch), static_cast<long long>(steps),
                    overlap ? ", all-reduce overlapping backward" : "");
        std::printf("  %.1f examples/s over all ranks, %.3f steps/s, all-reduce after backward %.3f ms of %.3f ms per step (%.1f %%)\n",
                    examples / total, steps / total, 1e3 * red.item<double>() / steps, 1e3 * total / steps,
                    100.0 * red.item<double>() / total);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qbench_dist: %s\n", e.what());
    return 1;
  }
  return 0;
}
