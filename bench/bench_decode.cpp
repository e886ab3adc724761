// End-to-end benchmark: prefill and decode tokens/s of a model folder on the chosen backends (medians).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "bench_util.hpp"
#include "strata/model.hpp"

using namespace strata;

int main(int argc, char** argv) {
  CLI::App app{"bench_decode: prefill and decode tok/s"};
  std::string model_dir, config;
  int prompt = 64, decode = 32, reps = 5, threads = 0;
  app.add_option("--model", model_dir)->required();
  app.add_option("--config", config);
  app.add_option("--prompt", prompt, "prompt tokens (one prefill batch)");
  app.add_option("--decode", decode, "decoded tokens");
  app.add_option("--reps", reps);
  app.add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);
  RuntimeConfig cfg = config.empty() ? RuntimeConfig{} : load_runtime_config(config);
  cfg.scheduler.threads = threads;
  PluginRegistry reg(plugin_search_path(cfg.plugins.path));
  auto model = Model::load(model_dir, choose_backends(reg, cfg));
  const auto& spec = model->spec();
  std::vector<int32_t> ids(static_cast<size_t>(prompt));
  for (int i = 0; i < prompt; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % spec.vocab);
  const double pre = bench::median_seconds(reps, [&] {
    Session s(model, threads);
    s.forward(ids, false);
  });
  Session base(model, threads);
  base.forward(ids, false);
  const double dec =
      bench::median_seconds(reps,
                            [&] {
                              Session s(model, threads);
                              s.forward(ids, false);
                              int32_t t = 1;
                              for (int i = 0; i < decode; ++i) {
                                auto l = s.forward(std::span<const int32_t>(&t, 1), false);
                                t = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
                              }
                            }) -
      pre;
  const auto pc = model->param_counts();
  fmt::print("model {} ({}), dense={} experts={}\n", model_dir, family_name(spec.family),
             model->backends().dense->name(), model->backends().experts.front()->name());
  fmt::print("parameters: {} dense + {} routed\n", pc.dense, pc.routed);
  fmt::print("prefill: {} tokens in {:.2f} ms median = {:.1f} tok/s\n", prompt, pre * 1e3, prompt / pre);
  fmt::print("decode:  {} tokens in {:.2f} ms median = {:.1f} tok/s\n", decode, dec * 1e3, decode / dec);
  return 0;
}
