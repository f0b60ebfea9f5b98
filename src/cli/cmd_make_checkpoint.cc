// `dsinfer make-checkpoint`: random-weight checkpoints in the official DeepSeek format.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/synthetic.h"
#include "model_v41/synthetic.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {

namespace {

// v4.1-tiny --tokenizer: the tiny config sized to `tokenizer_path`'s vocabulary, checked against
// V4.1's release tokenizer policy (BOS 0, EOS 1, PAD 2; spec deepseek-v41.md §9).
Status fit_v41_config_to_tokenizer(const std::string& tokenizer_path, nlohmann::json* config) {
  DSI_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::load(tokenizer_path));
  const struct {
    const char* text;
    int32_t id;
  } kPolicy[] = {{"<｜begin▁of▁sentence｜>", 0}, {"<｜end▁of▁sentence｜>", 1}, {"<｜▁pad▁｜>", 2}};
  for (const auto& p : kPolicy) {
    auto id = tok->token_to_id(p.text);
    if (!id || *id != p.id) {
      return invalid_argument(tokenizer_path + ": V4.1's tokenizer policy needs `" + p.text +
                              "` at id " + std::to_string(p.id));
    }
  }
  const int64_t vocab = tok->vocab_size();
  if (vocab < 8)
    return invalid_argument(tokenizer_path + ": vocabulary too small for a V4.1 model");
  nlohmann::json& t = (*config)["text_config"];
  t["vocab_size"] = vocab;
  // Random weights: every token its own Engram key (write_v41_streaming's map is the identity).
  t["engram_compressed_vocab_size"] = vocab;
  t["dspark_noise_token_id"] = vocab - 1;
  return Status();
}

Status copy_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in)
    return not_found("cannot open " + from);
  std::ofstream out(to, std::ios::binary);
  out << in.rdbuf();
  if (!out)
    return io_error("cannot write " + to);
  return Status();
}

// The tokenizer files beside the checkpoint (the Engram token map is write_v41_streaming's
// synthetic one: with engram_compressed_vocab_size = vocab_size, the identity. A real tokenizer's
// map comes from tools/reference/v41/engram_token_map.py; with random weights any valid map
// serves).
Status write_v41_tokenizer_files(const std::string& tokenizer_path, const std::string& dir) {
  DSI_RETURN_IF_ERROR(copy_file(tokenizer_path, dir + "/tokenizer.json"));
  const size_t slash = tokenizer_path.find_last_of('/');
  const std::string tc =
      (slash == std::string::npos ? std::string() : tokenizer_path.substr(0, slash + 1)) +
      "tokenizer_config.json";
  if (std::ifstream(tc).good())
    DSI_RETURN_IF_ERROR(copy_file(tc, dir + "/tokenizer_config.json"));
  return Status();
}

}  // namespace

void add_make_checkpoint_command(CLI::App& app, int& exit_code) {
  struct Args {
    std::string preset = "tiny";
    std::string out;
    uint64_t seed = 0;
    bool bf16 = false;
    bool no_mtp = false;
    int shards = 1;
    int layers = 0;
    int threads = 0;
    bool engram_real_rows = false;
    std::string tokenizer;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "make-checkpoint", "Write a random-weight V4 checkpoint (official FP8/MXFP4 layout)");
  cmd->add_option("--preset",
                  args->preset,
                  "tiny: a small V4 with every layer type (5 layers, written in memory); "
                  "v4-flash: DeepSeek-V4-Flash at its real widths (43 layers, ~3.6 GB per layer "
                  "and ~2 GB embed/head; use --layers), streamed to disk on all cores with one "
                  "shard per layer + index json; v4.1-flash: DeepSeek-V4.1-Flash at its real "
                  "widths (40 layers, ~7.3 GB per layer; --layers N keeps both YOCO halves), small "
                  "Engram tables unless --engram-real-rows, DSpark blocks, streamed like v4-flash; "
                  "v4.1-tiny: the tiny V4.1 test config through the same writer");
  cmd->add_option("--out", args->out, "Output directory")->required();
  cmd->add_option("--seed", args->seed, "Random seed");
  cmd->add_option("--layers",
                  args->layers,
                  "Keep only the first N main layers of the preset's layer schedule (1..43 for "
                  "v4-flash, 1..5 for tiny); compress_ratios and num_hash_layers are truncated "
                  "to match; default: all");
  cmd->add_option("--threads", args->threads, "v4-flash: worker threads (default: all cores)");
  cmd->add_flag("--engram-real-rows",
                args->engram_real_rows,
                "v4.1-flash: the real Engram row counts (2 x 94 GiB) instead of small tables");
  cmd->add_option("--tokenizer",
                  args->tokenizer,
                  "v4.1-tiny: size the vocabulary to this tokenizer.json (V4.1's policy: BOS 0, "
                  "EOS 1, PAD 2) and write it, its tokenizer_config.json and an Engram token map "
                  "beside the checkpoint, so that generate/serve can run it");
  cmd->add_flag("--bf16", args->bf16, "Store matrices in bf16 instead of FP8/MXFP4");
  cmd->add_flag("--no-mtp", args->no_mtp, "Leave out the MTP block");
  cmd->add_option("--shards",
                  args->shards,
                  "tiny: number of safetensors shards (index json when > 1); v4-flash always "
                  "writes one shard per layer");
  cmd->callback([args, cmd, &exit_code] {
    if (!args->tokenizer.empty() && args->preset != "v4.1-tiny") {
      exit_code = fail(invalid_argument("--tokenizer applies to the v4.1-tiny preset"));
      return;
    }
    if (args->preset == "v4.1-flash" || args->preset == "v4.1-tiny") {
      if (args->bf16 || args->no_mtp || cmd->count("--shards") > 0) {
        exit_code = fail(invalid_argument(
            "--bf16, --no-mtp and --shards apply to the V4 presets; V4.1 presets write the "
            "official layout with DSpark blocks, one shard per block"));
        return;
      }
      nlohmann::json config;
      if (args->preset == "v4.1-flash") {
        auto c = model_v41::v41_flash_preset_config(cmd->count("--layers") > 0 ? args->layers : 40,
                                                    args->engram_real_rows);
        if (!c.ok()) {
          exit_code = fail(c.status().with_context("--layers"));
          return;
        }
        config = std::move(c).value();
      } else {
        if (cmd->count("--layers") > 0 || args->engram_real_rows) {
          exit_code =
              fail(invalid_argument("v4.1-tiny takes neither --layers nor --engram-real-rows"));
          return;
        }
        config = model_v41::v41_tiny_config_json(true);
        if (!args->tokenizer.empty()) {
          Status s = fit_v41_config_to_tokenizer(args->tokenizer, &config);
          if (!s.ok()) {
            exit_code = fail(s.with_context("--tokenizer"));
            return;
          }
        }
      }
      model_v41::V41StreamStats stats;
      Status s =
          model_v41::write_v41_streaming(config, args->seed, args->threads, args->out, &stats);
      if (s.ok() && !args->tokenizer.empty())
        s = write_v41_tokenizer_files(args->tokenizer, args->out);
      if (!s.ok()) {
        exit_code = fail(s);
        return;
      }
      std::fprintf(stderr,
                   "dsinfer make-checkpoint: wrote %s (preset %s, %d layers + DSpark, seed %llu): "
                   "%lld tensors, %llu bytes in %d safetensors files\n",
                   args->out.c_str(),
                   args->preset.c_str(),
                   config["text_config"]["num_hidden_layers"].get<int>(),
                   static_cast<unsigned long long>(args->seed),
                   static_cast<long long>(stats.tensors),
                   static_cast<unsigned long long>(stats.bytes),
                   stats.files);
      exit_code = 0;
      return;
    }
    const bool flash = args->preset == "v4-flash";
    if (args->preset != "tiny" && !flash) {
      exit_code = fail(invalid_argument("--preset: unknown preset `" + args->preset +
                                        "` (available: tiny, v4-flash, v4.1-tiny, v4.1-flash)"));
      return;
    }
    if (args->shards < 1) {
      exit_code = fail(invalid_argument("--shards must be >= 1"));
      return;
    }
    if (flash && cmd->count("--shards") > 0) {
      exit_code = fail(invalid_argument(
          "--shards applies to the tiny preset; v4-flash writes one shard per layer"));
      return;
    }
    if (args->threads < 0) {
      exit_code = fail(invalid_argument("--threads must be >= 0 (0 = all cores)"));
      return;
    }
    const bool layers_given = cmd->count("--layers") > 0;
    model::SyntheticSpec spec;
    if (flash) {
      auto config =
          model::v4_flash_preset_config(layers_given ? args->layers : model::kV4FlashLayers);
      if (!config.ok()) {
        exit_code = fail(config.status().with_context("--layers"));
        return;
      }
      spec.config = std::move(config).value();
      spec.generator = model::SyntheticGenerator::kStreaming;
      spec.threads = args->threads;
      spec.progress = [](const std::string& line) {
        std::fprintf(stderr, "dsinfer make-checkpoint: %s\n", line.c_str());
      };
    } else {
      spec.config = model::tiny_preset_config();
      if (layers_given) {
        auto config = model::truncate_layers(spec.config, args->layers);
        if (!config.ok()) {
          exit_code = fail(config.status().with_context("--layers (tiny preset)"));
          return;
        }
        spec.config = std::move(config).value();
      }
    }
    spec.seed = args->seed;
    spec.quantized = !args->bf16;
    spec.with_mtp = !args->no_mtp;
    spec.num_shards = args->shards;
    model::SyntheticWriteStats stats;
    spec.stats = &stats;
    Status s = model::write_synthetic_checkpoint(spec, args->out);
    if (!s.ok()) {
      exit_code = fail(s);
      return;
    }
    std::fprintf(stderr,
                 "dsinfer make-checkpoint: wrote %s (preset %s, %lld layers%s, seed %llu): "
                 "%lld tensors, %llu bytes in %d safetensors files\n",
                 args->out.c_str(),
                 args->preset.c_str(),
                 static_cast<long long>(spec.config.num_hidden_layers),
                 spec.with_mtp ? " + MTP" : "",
                 static_cast<unsigned long long>(args->seed),
                 static_cast<long long>(stats.tensors),
                 static_cast<unsigned long long>(stats.bytes),
                 stats.files);
    exit_code = 0;
  });
}

}  // namespace dsinfer::cli
