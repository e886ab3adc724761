// strata — command-line entry point: parses the subcommand and turns errors into messages and exit codes.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.hpp"

int main(int argc, char** argv) {
  using namespace strata::app;
  CLI::App app{"strata — run frontier Mixture-of-Experts LLMs on the hardware you have"};
  app.require_subcommand(1);

  CommonOptions common;
  auto add_common = [&](CLI::App* sc) {
    sc->add_option("--config", common.config, "YAML runtime config (plugins, backends, memory, scheduler)")
        ->check(CLI::ExistingFile);
    sc->add_option("--threads", common.threads, "host threads (0 = all; overrides scheduler.threads)")
        ->check(CLI::NonNegativeNumber);
  };

  ModelOptions mo;
  auto add_model = [&](CLI::App* sc, bool need_ids) {
    add_common(sc);
    sc->add_option("--model", mo.model, "Hugging Face model directory (config.json + *.safetensors)")->required();
    if (need_ids) sc->add_option("--ids", mo.ids, "comma-separated token ids, e.g. 3,17,42")->required();
    sc->add_option("--quant", mo.quant, "quantize float routed experts at load: q4_g64, q4_row or none")
        ->check(CLI::IsMember({"q4_g64", "q4_row", "none"}));
  };

  auto* plugins = app.add_subcommand("plugins", "list the backend plugins found, their scores, and which are chosen");
  add_common(plugins);

  int64_t prefill = -1;
  std::string out;
  auto* logits = app.add_subcommand("logits", "write the logits of every position to a safetensors file");
  add_model(logits, true);
  logits->add_option("--prefill", prefill, "feed the first N ids as one batch, the rest one at a time (default all)");
  logits->add_option("--out", out, "output .safetensors (tensor 'logits', F32 [T, vocab])")->required();

  int64_t max_new = 16;
  bool greedy = false, print_ids = false;
  auto* generate = app.add_subcommand("generate", "continue a sequence of token ids (greedy decoding)");
  add_model(generate, true);
  generate->add_option("--max-new", max_new, "number of tokens to generate")->check(CLI::NonNegativeNumber);
  generate->add_flag("--greedy", greedy, "greedy decoding (argmax; the mode of this command)");
  generate->add_flag("--print-ids", print_ids, "print only the generated ids, space-separated, on one line");

  auto* inspect = app.add_subcommand("inspect", "report a model's shapes, parameter counts and KV bytes per token");
  add_model(inspect, false);

  ConvertCliOptions co;
  auto* convert = app.add_subcommand("convert", "convert a Hugging Face checkpoint into a strata int4 container");
  convert->add_option("--in", co.in, "Hugging Face model directory (config.json + *.safetensors)")->required();
  convert->add_option("--out", co.out, "output container directory (built in DIR.partial, renamed at the end)")->required();
  convert->add_option("--format", co.format, "routed experts: q4_g64 (default) or q4_row");
  convert->add_option("--dense-format", co.dense, "other 2-D weights: keep (default), bf16 or q4_g64");
  convert->add_option("--shard-size-mb", co.shard_size_mb, "target size of an output shard in MiB (default 2048)");
  convert->add_flag("--force", co.force, "replace an existing strata container at --out");

  CLI11_PARSE(app, argc, argv);
  try {
    mo.common = common;
    if (*plugins) return cmd_plugins(common);
    if (*logits) return cmd_logits(mo, prefill, out);
    if (*generate) return cmd_generate(mo, max_new, print_ids);
    if (*inspect) return cmd_inspect(mo);
    if (*convert) return cmd_convert(co);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: %s\n", e.what());
    return 1;
  }
  return 0;
}
