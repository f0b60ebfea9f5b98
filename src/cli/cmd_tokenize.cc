// `dsinfer tokenize` / `dsinfer detokenize`: text <-> token ids with a tokenizer.json.
//
//   dsinfer tokenize --tokenizer tokenizer.json --text "Hello <think>"   -> [19923, ...]
//   dsinfer tokenize --tokenizer DIR --file prompt.txt --allow-special
//   dsinfer detokenize --tokenizer tokenizer.json --ids "[19923, 3]"     -> Hello!
//
// Text comes from --text, --file or stdin; ids from --ids, --file or stdin, as a JSON array or
// a comma/space-separated list (so `tokenize | detokenize` round-trips).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "base/strings.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {

namespace {

Result<std::string> read_all(FILE* f, const std::string& name) {
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  if (std::ferror(f))
    return io_error("error reading " + name);
  return out;
}

Result<std::string> read_input(const std::string& path) {
  if (path.empty() || path == "-")
    return read_all(stdin, "stdin");
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr)
    return not_found("cannot open " + path);
  auto r = read_all(f, path);
  std::fclose(f);
  return r;
}

// "[1, 2, 3]", "1,2,3" or "1 2 3" -> ids.
Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  size_t index = 0;
  auto flush = [&]() -> Status {
    if (item.empty())
      return Status();
    ++index;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > 2147483647LL) {
      return invalid_argument(
          str_format("token id %zu (\"%s\") is not a non-negative integer", index, item.c_str()));
    }
    ids.push_back(static_cast<int32_t>(v));
    item.clear();
    return Status();
  };
  for (char c : text) {
    if (c == '[' || c == ']' || c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      DSI_RETURN_IF_ERROR(flush());
    } else {
      item.push_back(c);
    }
  }
  DSI_RETURN_IF_ERROR(flush());
  return ids;
}

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0)
      out += ", ";
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  return out;
}

struct TokenizeArgs {
  std::string tokenizer;
  std::string text;
  std::string file;
  bool allow_special = false;
};

int run_tokenize(const TokenizeArgs& args, bool has_text) {
  auto tok = tokenizer::Tokenizer::load(args.tokenizer);
  if (!tok.ok())
    return fail(tok.status());
  std::string text = args.text;
  if (!has_text) {
    auto in = read_input(args.file);
    if (!in.ok())
      return fail(in.status());
    text = std::move(in).value();
  }
  auto ids = (*tok)->encode(text, args.allow_special);
  if (!ids.ok())
    return fail(ids.status());
  const std::string out = ids_json(*ids);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

struct DetokenizeArgs {
  std::string tokenizer;
  std::string ids;
  std::string file;
  bool skip_special = false;
};

int run_detokenize(const DetokenizeArgs& args, bool has_ids) {
  auto tok = tokenizer::Tokenizer::load(args.tokenizer);
  if (!tok.ok())
    return fail(tok.status());
  std::string list = args.ids;
  if (!has_ids) {
    auto in = read_input(args.file);
    if (!in.ok())
      return fail(in.status());
    list = std::move(in).value();
  }
  auto ids = parse_ids(list);
  if (!ids.ok())
    return fail(ids.status());
  auto text = (*tok)->decode(*ids, args.skip_special);
  if (!text.ok())
    return fail(text.status());
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json, or a directory containing it")
      ->required();
  CLI::Option* text = cmd->add_option("--text", args->text, "The text to tokenize");
  CLI::Option* file =
      cmd->add_option("--file", args->file, "Read the text from this file (default: stdin)");
  text->excludes(file);
  cmd->add_flag("--allow-special",
                args->allow_special,
                "Turn added/special-token spellings in the text (e.g. <｜User｜>, <think>) into "
                "their ids; by default they are ordinary text");
  cmd->callback([args, text, &exit_code] { exit_code = run_tokenize(*args, text->count() > 0); });
}

void add_detokenize_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<DetokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("detokenize", "Print the text of a list of token ids");
  cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json, or a directory containing it")
      ->required();
  CLI::Option* ids =
      cmd->add_option("--ids", args->ids, "Token ids: a JSON array or comma-separated list");
  CLI::Option* file =
      cmd->add_option("--file", args->file, "Read the ids from this file (default: stdin)");
  ids->excludes(file);
  cmd->add_flag("--skip-special", args->skip_special, "Leave out special tokens (BOS, EOS, ...)");
  cmd->callback([args, ids, &exit_code] { exit_code = run_detokenize(*args, ids->count() > 0); });
}

}  // namespace dsinfer::cli
