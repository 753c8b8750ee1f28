// The recipe and dist components from an installed qforge: a recipe file loaded, resolved and
// validated (its scheme printed), and a data-parallel world from torchrun's environment (one
// process without it) summing a tensor over its ranks and sharding a dataset.
#include <qforge/framework/dist/world.h>
#include <qforge/framework/recipe/recipe.h>
#include <qforge/qforge.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: recipe_dist RECIPE.yaml\n");
    return 2;
  }
  const qforge::Recipe recipe = qforge::load_recipe(argv[1]);
  std::printf("%s: model %s, scheme %s, sha256 %.12s\n", argv[1], recipe.model.arch.c_str(),
              recipe.scheme.to_string().c_str(), recipe.sha256.c_str());
  const qforge::dist::World world = qforge::dist::World::from_env();
  at::Tensor t = at::arange(4, at::kFloat);
  world.all_reduce(t, qforge::dist::Reduce::kSum);
  const auto shard = qforge::dist::shard_indices(10, world.rank(), world.size());
  std::printf("%s: all_reduce sum %s, %zu of 10 examples\n", world.prefix().c_str(),
              at::equal(t, at::arange(4, at::kFloat) * world.size()) ? "right" : "WRONG", shard.size());
  const bool ok = recipe.quantize && at::equal(t, at::arange(4, at::kFloat) * world.size());
  std::printf("%s\n", ok ? "recipe loaded and world reduced" : "FAILED");
  return ok ? 0 : 1;
}
