// Offline requests (frontend/offline.h): JSONL request objects -> engine input, with the field
// errors `dsinfer generate` and the Python package report; the result object of a request.
#include "frontend/offline.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dsinfer::frontend {
namespace {

using json = nlohmann::ordered_json;

OfflineJob job_of(const std::string& text, const OfflineDefaults& d = {}) {
  return make_offline_job(json::parse(text), d, nullptr, recipe::ModelVersion::kV4);
}

TEST(OfflineJob, TokenIdsWithDefaultsAndOverrides) {
  OfflineDefaults d;
  d.max_tokens = 7;
  d.sampling.temperature = 0.5f;
  d.stop_token_ids = {9};
  d.logprobs = 2;
  OfflineJob j = job_of(R"({"prompt_token_ids": [0, 17, 42], "top_k": 5, "seed": 3,
                            "stop_token_ids": [4]})",
                        d);
  ASSERT_EQ(j.error, "");
  EXPECT_EQ(j.prompt, (std::vector<int32_t>{0, 17, 42}));
  EXPECT_EQ(j.spec.prompt, j.prompt);
  EXPECT_EQ(j.spec.max_tokens, 7);
  EXPECT_FLOAT_EQ(j.spec.sampling.temperature, 0.5f);
  EXPECT_EQ(j.spec.sampling.top_k, 5);
  EXPECT_EQ(j.spec.sampling.seed, 3u);
  EXPECT_EQ(j.spec.stop_token_ids, (std::vector<int32_t>{4, 9}));  // the request's, then defaults
  EXPECT_EQ(j.logprobs, 2);
  EXPECT_TRUE(j.spec.sampling.logprobs);
  EXPECT_EQ(j.spec.sampling.top_logprobs, 2);
  EXPECT_FALSE(j.chat);

  OfflineJob none = job_of(R"({"prompt_token_ids": [1], "logprobs": 0})", d);
  EXPECT_EQ(none.logprobs, 0);
  EXPECT_FALSE(none.spec.sampling.logprobs);
}

TEST(OfflineJob, FieldErrorsNameTheField) {
  EXPECT_EQ(job_of(R"({"prompt_token_ids": [1], "temperature": "hot"})").error,
            "field 'temperature' must be a number");
  EXPECT_EQ(job_of(R"({"prompt_token_ids": [1], "max_tokens": 1.5})").error,
            "field 'max_tokens' must be an integer");
  EXPECT_EQ(job_of(R"({"prompt_token_ids": [1], "ignore_eos": 1})").error,
            "field 'ignore_eos' must be a boolean");
  EXPECT_EQ(job_of(R"({"prompt_token_ids": [1], "stop": [1]})").error,
            "field 'stop' must be a string or a list of strings");
  EXPECT_EQ(job_of(R"({"prompt_token_ids": [1], "stop_token_ids": "4"})").error,
            "field 'stop_token_ids' must be a list of integers");
  EXPECT_EQ(job_of(R"({"prompt_token_ids": [1, "a"]})").error,
            "field 'prompt_token_ids' must be a list of integers");
  EXPECT_EQ(job_of(R"({"prompt_token_ids": [1], "prompt": "x"})").error,
            "give exactly one of 'prompt', 'prompt_token_ids' or 'messages'");
  EXPECT_EQ(job_of(R"({})").error,
            "give exactly one of 'prompt', 'prompt_token_ids' or 'messages'");
  EXPECT_EQ(job_of(R"([1, 2])").error, "each input line must be a JSON object");
}

TEST(OfflineJob, TextNeedsATokenizer) {
  EXPECT_NE(job_of(R"({"prompt": "def f():"})").error.find("has no tokenizer.json"),
            std::string::npos);
  EXPECT_NE(job_of(R"({"messages": [{"role": "user", "content": "hi"}]})")
                .error.find("has no tokenizer.json"),
            std::string::npos);
  EXPECT_EQ(job_of(R"({"prompt_token_ids": [1], "stop": "x"})").error,
            "stop strings need the model's tokenizer.json");
}

// DeepSeek V4.1's release tokenizer policy: BOS first on text prompts only (token ids and
// rendered chat prompts are taken as they are).
TEST(OfflineJob, TextPromptBosPolicy) {
  auto tok = tokenizer::Tokenizer::load(std::string(DSI_SOURCE_DIR) +
                                        "/tests/fixtures/tokenizer/tiny/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  OfflineDefaults d;
  d.text_prompt_bos = 0;
  const json text = json::parse(R"({"prompt": "def f():"})");
  OfflineJob with = make_offline_job(text, d, tok->get(), recipe::ModelVersion::kV41);
  ASSERT_EQ(with.error, "");
  const std::vector<int32_t> plain = (*tok)->encode("def f():", false).value();
  ASSERT_EQ(with.prompt.size(), plain.size() + 1);
  EXPECT_EQ(with.prompt[0], 0);
  EXPECT_EQ(std::vector<int32_t>(with.prompt.begin() + 1, with.prompt.end()), plain);
  OfflineJob ids = make_offline_job(
      json::parse(R"({"prompt_token_ids": [5, 6]})"), d, tok->get(), recipe::ModelVersion::kV41);
  EXPECT_EQ(ids.prompt, (std::vector<int32_t>{5, 6}));
  d.text_prompt_bos = -1;  // V4 / native policy
  EXPECT_EQ(make_offline_job(text, d, tok->get(), recipe::ModelVersion::kV4).prompt, plain);
}

// Chat messages: V4.1 refuses image content (no vision tower yet), V4 renders it as text;
// parallel_tool_calls false limits the parser to one tool call.
TEST(OfflineJob, V41ImagesAndParallelToolCalls) {
  auto tok = tokenizer::Tokenizer::load(std::string(DSI_SOURCE_DIR) +
                                        "/tests/fixtures/tokenizer/tiny/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  const json image = json::parse(R"({"messages": [{"role": "user", "content": [
      {"type": "text", "text": "what is it"},
      {"type": "image_url", "image_url": {"url": "data:,"}}]}]})");
  OfflineJob v41 = make_offline_job(image, {}, tok->get(), recipe::ModelVersion::kV41);
  EXPECT_NE(v41.error.find("image_url"), std::string::npos) << v41.error;
  EXPECT_NE(v41.error.find("V4.1"), std::string::npos) << v41.error;
  EXPECT_EQ(make_offline_job(image, {}, tok->get(), recipe::ModelVersion::kV4).error, "");
  // (V4 rendering: the fixture tokenizer has no `<｜System｜>` for V4.1's tools prompt.)
  const std::string tools =
      R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
      "function": {"name": "f", "parameters": {}}}])";
  OfflineJob one = make_offline_job(json::parse(tools + R"(, "parallel_tool_calls": false})"),
                                    {},
                                    tok->get(),
                                    recipe::ModelVersion::kV4);
  ASSERT_EQ(one.error, "");
  EXPECT_EQ(one.parser.max_tool_calls, 1);
  OfflineJob any =
      make_offline_job(json::parse(tools + "}"), {}, tok->get(), recipe::ModelVersion::kV4);
  ASSERT_EQ(any.error, "");
  EXPECT_EQ(any.parser.max_tool_calls, 0);
}

TEST(OfflineResult, FieldsAndLogprobs) {
  OfflineJob j = job_of(R"({"prompt_token_ids": [0, 1, 2], "logprobs": 1})");
  ASSERT_EQ(j.error, "");
  engine::Request r;
  r.spec.prompt = j.prompt;
  r.output = {5, 6};
  r.finish_reason = engine::FinishReason::kLength;
  r.timings = {1.0, 1.5, 2.0};
  std::vector<TokenLogprobs> lps = {{5, -0.5f, {{5, -0.5f}}}, {6, -1.0f, {{7, -0.25f}}}};
  json o = offline_result(3, j, r, nullptr, lps);
  EXPECT_EQ(o["index"], 3);
  EXPECT_EQ(o["text"], "");
  EXPECT_EQ(o["output_token_ids"], json::array({5, 6}));
  EXPECT_EQ(o["finish_reason"], "length");
  EXPECT_EQ(o["prompt_tokens"], 3);
  EXPECT_EQ(o["completion_tokens"], 2);
  EXPECT_DOUBLE_EQ(o["ttft_s"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(o["latency_s"].get<double>(), 1.0);
  ASSERT_EQ(o["logprobs"].size(), 2u);
  EXPECT_EQ(o["logprobs"][1]["token"], 6);
  EXPECT_EQ(o["logprobs"][1]["top"][0][0], 7);
  EXPECT_FALSE(o.contains("reasoning_content"));

  OfflineJob plain = job_of(R"({"prompt_token_ids": [0]})");
  EXPECT_FALSE(offline_result(0, plain, r, nullptr, {}).contains("logprobs"));
}

}  // namespace
}  // namespace dsinfer::frontend
