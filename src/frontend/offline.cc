// Offline batch requests: JSON request object -> engine input; finished request -> JSON result.
#include "frontend/offline.h"

#include <memory>
#include <type_traits>
#include <utility>

#include "api/chat.h"
#include "frontend/prepare.h"

namespace dsinfer::frontend {

namespace {
using json = nlohmann::ordered_json;

template <typename T>
bool read_field(const json& j, const char* key, T* out, std::string* err) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    return true;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) {
      *err = std::string("field '") + key + "' must be a boolean";
      return false;
    }
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) {
      *err = std::string("field '") + key + "' must be an integer";
      return false;
    }
  } else {
    if (!it->is_number()) {
      *err = std::string("field '") + key + "' must be a number";
      return false;
    }
  }
  *out = it->get<T>();
  return true;
}

// Reads an optional list of integers (token ids) into `out`; false with `err` set when malformed.
bool read_ids(const json& line, const char* key, std::vector<int32_t>* out, std::string* err) {
  auto it = line.find(key);
  if (it == line.end() || it->is_null())
    return true;
  const std::string msg = std::string("field '") + key + "' must be a list of integers";
  if (!it->is_array()) {
    *err = msg;
    return false;
  }
  for (const auto& v : *it) {
    if (!v.is_number_integer()) {
      *err = msg;
      return false;
    }
    out->push_back(v.get<int32_t>());
  }
  return true;
}

// The request's own fields over the defaults; false with job->error set on a bad field.
bool read_sampling(const json& line, OfflineJob* job) {
  auto& s = job->spec;
  std::string& err = job->error;
  int64_t lp = job->logprobs;
  if (!read_field(line, "max_tokens", &s.max_tokens, &err) ||
      !read_field(line, "temperature", &s.sampling.temperature, &err) ||
      !read_field(line, "top_p", &s.sampling.top_p, &err) ||
      !read_field(line, "top_k", &s.sampling.top_k, &err) ||
      !read_field(line, "min_p", &s.sampling.min_p, &err) ||
      !read_field(line, "seed", &s.sampling.seed, &err) ||
      !read_field(line, "presence_penalty", &s.sampling.presence_penalty, &err) ||
      !read_field(line, "frequency_penalty", &s.sampling.frequency_penalty, &err) ||
      !read_field(line, "repetition_penalty", &s.sampling.repetition_penalty, &err) ||
      !read_field(line, "ignore_eos", &s.ignore_eos, &err) ||
      !read_field(line, "logprobs", &lp, &err)) {
    return false;
  }
  job->logprobs = static_cast<int32_t>(lp);
  s.sampling.top_logprobs = job->logprobs;
  s.sampling.logprobs = lp > 0;
  if (auto it = line.find("stop"); it != line.end() && !it->is_null()) {
    job->stops.clear();
    if (it->is_string()) {
      job->stops.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& v : *it) {
        if (!v.is_string()) {
          err = "field 'stop' must be a string or a list of strings";
          return false;
        }
        job->stops.push_back(v.get<std::string>());
      }
    } else {
      err = "field 'stop' must be a string or a list of strings";
      return false;
    }
  }
  return read_ids(line, "stop_token_ids", &s.stop_token_ids, &err);
}

// The prompt ids from exactly one of prompt_token_ids, prompt or messages.
bool read_prompt(const json& line,
                 const OfflineDefaults& d,
                 const tokenizer::Tokenizer* tok,
                 recipe::ModelVersion version,
                 OfflineJob* job) {
  std::string& err = job->error;
  const int inputs = static_cast<int>(line.contains("prompt")) +
                     static_cast<int>(line.contains("prompt_token_ids")) +
                     static_cast<int>(line.contains("messages"));
  if (inputs != 1) {
    err = "give exactly one of 'prompt', 'prompt_token_ids' or 'messages'";
    return false;
  }
  if (line.contains("prompt_token_ids")) {
    if (line["prompt_token_ids"].is_null()) {
      err = "field 'prompt_token_ids' must be a list of integers";
      return false;
    }
    return read_ids(line, "prompt_token_ids", &job->prompt, &err);
  }
  if (tok == nullptr) {
    err =
        "the model directory has no tokenizer.json: text prompts and messages need one "
        "(use prompt_token_ids / --prompt-token-ids)";
    return false;
  }
  if (auto p = line.find("prompt"); p != line.end()) {
    if (!p->is_string()) {
      err = "field 'prompt' must be a string";
      return false;
    }
    auto ids = tok->encode(p->get<std::string>(), /*allow_special=*/false);
    if (!ids.ok()) {
      err = ids.status().message();
      return false;
    }
    job->prompt = std::move(ids).value();
    if (d.text_prompt_bos >= 0)
      job->prompt.insert(job->prompt.begin(), d.text_prompt_bos);
    return true;
  }
  // Chat messages: through the Chat Completions decoder and the DeepSeek prompt format.
  json body = {{"model", "dsinfer"}, {"messages", line["messages"]}};
  if (auto t = line.find("tools"); t != line.end() && !t->is_null())
    body["tools"] = *t;
  // false: at most one tool call (the decoder checks the type).
  if (auto p = line.find("parallel_tool_calls"); p != line.end())
    body["parallel_tool_calls"] = *p;
  bool think = d.thinking;
  if (!read_field(line, "thinking", &think, &err))
    return false;
  body["thinking"] = {{"type", think ? "enabled" : "disabled"}};
  api::DecodeOptions opts;
  opts.apply_thinking_sampling_rules = false;
  auto req = api::decode_chat_request(body.dump(), opts);
  if (!req.ok()) {
    err = req.error().message;
    return false;
  }
  auto prepared = prepare_conversation(req.value(), *tok, version);
  if (!prepared.ok()) {
    err = prepared.status().message();
    return false;
  }
  job->prompt = std::move(prepared->tokens);
  job->parser = prepared->parser;
  job->chat = true;
  return true;
}
}  // namespace

OfflineJob make_offline_job(const json& line,
                            const OfflineDefaults& d,
                            const tokenizer::Tokenizer* tok,
                            recipe::ModelVersion version) {
  OfflineJob job;
  auto& s = job.spec;
  s.max_tokens = d.max_tokens;
  s.sampling = d.sampling;
  job.logprobs = d.logprobs;
  s.sampling.top_logprobs = d.logprobs;
  s.sampling.logprobs = d.logprobs > 0;
  s.ignore_eos = d.ignore_eos;
  job.stops = d.stop;
  if (!line.is_object()) {
    job.error = "each input line must be a JSON object";
    return job;
  }
  if (!read_sampling(line, &job) || !read_prompt(line, d, tok, version, &job))
    return job;
  job.parser.stop_sequences = job.stops;
  s.prompt = job.prompt;
  s.stop_token_ids.insert(s.stop_token_ids.end(), d.stop_token_ids.begin(), d.stop_token_ids.end());
  if (!job.stops.empty()) {
    if (tok == nullptr) {
      job.error = "stop strings need the model's tokenizer.json";
      return job;
    }
    s.stop_checker = std::make_unique<TextStopChecker>(*tok, job.stops);
  }
  return job;
}

json offline_result(int64_t index,
                    const OfflineJob& job,
                    const engine::Request& r,
                    const tokenizer::Tokenizer* tok,
                    const std::vector<TokenLogprobs>& logprobs) {
  json o = {{"index", index}};
  std::string text;
  if (tok != nullptr) {
    auto t = tok->decode(r.output, /*skip_special=*/true);
    if (t.ok())
      text = *t;
  }
  std::string matched = truncate_at_stop(text, job.stops);
  o["text"] = text;
  if (job.chat && tok != nullptr) {
    // Token-fed: added tokens are control tokens, everything else is text, so a special-token
    // spelling the model wrote with ordinary tokens stays text (as the server parses).
    auto parsed = parse_output_tokens(*tok,
                                      r.output,
                                      job.parser,
                                      r.finish_reason == engine::FinishReason::kLength
                                          ? recipe::FinishReason::kLength
                                          : recipe::FinishReason::kStop);
    o["reasoning_content"] = parsed.reasoning;
    o["content"] = parsed.content;
    if (!parsed.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& c : parsed.tool_calls)
        calls.push_back({{"name", c.name}, {"arguments", c.arguments}});
      o["tool_calls"] = std::move(calls);
    }
  }
  o["output_token_ids"] = r.output;
  o["finish_reason"] = engine::finish_reason_name(r.finish_reason);
  if (!matched.empty())
    o["stop_reason"] = matched;
  if (!r.error.empty())
    o["error"] = r.error;
  o["prompt_tokens"] = r.spec.prompt.size();
  o["completion_tokens"] = r.output.size();
  o["ttft_s"] = r.timings.first_token_s > 0 ? r.timings.first_token_s - r.timings.arrival_s : -1.0;
  o["latency_s"] = r.timings.finish_s - r.timings.arrival_s;
  if (job.logprobs > 0) {
    json lps = json::array();
    for (const TokenLogprobs& t : logprobs) {
      json top = json::array();
      for (const auto& a : t.top) top.push_back({a.token, a.logprob});
      lps.push_back({{"token", t.token}, {"logprob", t.logprob}, {"top", std::move(top)}});
    }
    o["logprobs"] = std::move(lps);
  }
  return o;
}

}  // namespace dsinfer::frontend
