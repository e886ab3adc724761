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
  // need_model: logits, generate and inspect take token ids or report on a checkpoint, so they need one
  // named; run, chat and serve fall back to the bundled model.
  auto add_model = [&](CLI::App* sc, bool need_ids, bool need_model = true) {
    add_common(sc);
    auto* m = sc->add_option("--model", mo.model,
                             need_model ? "Hugging Face model directory (config.json + *.safetensors)"
                                        : "Hugging Face model directory (default: the bundled strata-nano)");
    if (need_model) m->required();
    if (need_ids) sc->add_option("--ids", mo.ids, "comma-separated token ids, e.g. 3,17,42")->required();
    sc->add_option("--quant", mo.quant, "quantize float routed experts at load: q4_g64, q4_row or none")
        ->check(CLI::IsMember({"q4_g64", "q4_row", "none"}));
  };

  auto* plugins =
      app.add_subcommand("plugins", "list the backend plugins found, their scores, and which are chosen");
  add_common(plugins);

  int64_t prefill = -1;
  std::string out;
  auto* logits = app.add_subcommand("logits", "write the logits of every position to a safetensors file");
  add_model(logits, true);
  logits->add_option("--prefill", prefill,
                     "feed the first N ids as one batch, the rest one at a time (default all)");
  logits->add_option("--out", out, "output .safetensors (tensor 'logits', F32 [T, vocab])")->required();

  int64_t max_new = 16;
  bool greedy = false, print_ids = false;
  auto* generate = app.add_subcommand("generate", "continue a sequence of token ids (greedy decoding)");
  add_model(generate, true);
  generate->add_option("--max-new", max_new, "number of tokens to generate")->check(CLI::NonNegativeNumber);
  generate->add_flag("--greedy", greedy, "greedy decoding (argmax; the mode of this command)");
  generate->add_flag("--print-ids", print_ids, "print only the generated ids, space-separated, on one line");

  auto* inspect =
      app.add_subcommand("inspect", "report a model's shapes, parameter counts and KV bytes per token");
  add_model(inspect, false);

  ConvertCliOptions co;
  auto* convert =
      app.add_subcommand("convert", "convert a Hugging Face checkpoint into a strata int4 container");
  convert->add_option("--in", co.in, "Hugging Face model directory (config.json + *.safetensors)")
      ->required();
  convert
      ->add_option("--out", co.out, "output container directory (built in DIR.partial, renamed at the end)")
      ->required();
  convert->add_option("--format", co.format, "routed experts: q4_g64 (default) or q4_row");
  convert->add_option("--dense-format", co.dense, "other 2-D weights: keep (default), bf16 or q4_g64");
  convert->add_option("--shard-size-mb", co.shard_size_mb,
                      "target size of an output shard in MiB (default 2048)");
  convert->add_flag("--force", co.force, "replace an existing strata container at --out");

  GenOptions go;
  auto add_gen = [&](CLI::App* sc) {
    sc->add_option("--max-new", go.max_new, "tokens to generate at most (default 256)")
        ->check(CLI::PositiveNumber);
    sc->add_option("--temperature", go.temperature,
                   "sampling temperature (0 = greedy; default: the model's)");
    sc->add_option("--top-p", go.top_p, "nucleus sampling threshold in (0, 1]");
    sc->add_option("--top-k", go.top_k, "sample among the k most likely tokens (0 = off)");
    sc->add_option("--min-p", go.min_p, "drop tokens below min_p times the most likely one's probability");
    sc->add_option("--seed", go.seed, "random seed for reproducible sampling");
    sc->add_option("--stop", go.stop, "stop string (repeatable)");
    sc->add_option("--stats", go.stats, "per-turn statistics format: json")->check(CLI::IsMember({"json"}));
  };
  std::string prompt;
  auto* run =
      app.add_subcommand("run", "complete one prompt, streaming the text to stdout (statistics to stderr)");
  add_model(run, false, false);
  add_gen(run);
  run->add_option("--prompt", prompt, "the text to continue")->required();

  std::string system;
  auto* chat = app.add_subcommand("chat", "talk to a model interactively with its chat template");
  add_model(chat, false, false);
  add_gen(chat);
  chat->add_option("--system", system, "system message");

  ServeOptions so;
  auto* serve =
      app.add_subcommand("serve", "serve an OpenAI-compatible HTTP API (/v1/chat/completions, ...)");
  add_model(serve, false, false);
  add_gen(serve);
  serve->add_option("--host", so.host, "address to listen on (default 127.0.0.1)");
  serve->add_option("--port", so.port, "port (default 8080)")->check(CLI::Range(0, 65535));
  serve->add_option("--api-key", so.api_key, "require 'Authorization: Bearer KEY' (also STRATA_API_KEY)");
  serve->add_option("--model-name", so.model_name,
                    "model id reported by /v1/models (default: the folder name)");
  serve->add_option("--parallel", so.parallel, "sequences decoded together (default 8)")
      ->check(CLI::Range(1, 256));
  serve->add_option("--queue", so.queue, "waiting requests before 429 (default 16)")
      ->check(CLI::Range(0, 100000));
  serve->add_option("--max-body-kb", so.max_body_kb, "largest request body in KiB (default 4096)")
      ->check(CLI::PositiveNumber);

  BenchOptions bo;
  auto* bench = app.add_subcommand(
      "bench", "measure prefill and decode speed of a model under a config (random prompt, greedy decode)");
  add_model(bench, false, false);
  bench->add_option("--prefill", bo.run.prefill, "prompt tokens, fed as one batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  bench->add_option("--decode", bo.run.decode, "greedy decode steps after the prompt")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  bench->add_option("--reps", bo.run.reps, "measured repetitions (medians)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  bench->add_option("--warmup", bo.run.warmup, "repetitions run first, left out of the medians")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  bench->add_option("--seed", bo.run.seed, "seed of the random prompt")->capture_default_str();
  bench->add_flag("--json", bo.json, "print one JSON object instead of text");

  TokenizeOptions to;
  auto* tokenize =
      app.add_subcommand("tokenize", "encode a JSON list of strings to token ids (or decode id lists)");
  tokenize->add_option("--tokenizer", to.tokenizer, "Hugging Face tokenizer.json")->required();
  tokenize
      ->add_option("--input", to.input, "JSON list of strings (with --decode: list of id lists); - = stdin")
      ->required();
  tokenize->add_flag("--decode", to.decode, "decode id lists to strings instead");
  tokenize->add_flag("--add-special-tokens", to.add_special_tokens,
                     "apply the post-processor's BOS/EOS template");
  tokenize->add_flag("--skip-special-tokens", to.skip_special_tokens, "with --decode: drop special tokens");

  CLI11_PARSE(app, argc, argv);
  try {
    mo.common = common;
    if (*plugins) return cmd_plugins(common);
    if (*logits) return cmd_logits(mo, prefill, out);
    if (*generate) return cmd_generate(mo, max_new, print_ids);
    if (*inspect) return cmd_inspect(mo);
    if (*bench) return cmd_bench(mo, bo);
    if (*convert) return cmd_convert(co);
    if (*tokenize) return cmd_tokenize(to);
    if (*run) return cmd_run(mo, go, prompt);
    if (*chat) return cmd_chat(mo, go, system);
    if (*serve) return cmd_serve(mo, go, so);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: %s\n", e.what());
    return 1;
  }
  return 0;
}
