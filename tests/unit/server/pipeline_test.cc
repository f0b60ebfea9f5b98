// OutputPipeline (token ids -> decoder -> parser -> events, reasoning-token accounting) and the
// test-only ScriptedOutputs, driven by a deterministic token source: model text tokenized with
// the fixture tokenizer and fed one id at a time.
#include <gtest/gtest.h>

#include "grammar/grammar.h"
#include "grammar/tool_calls.h"
#include "recipe/encoder.h"
#include "recipe/output_parser.h"
#include "recipe/tokens.h"
#include "server/generation.h"
#include "server_test_util.h"

namespace dsinfer::server {
namespace {

using recipe::FinishReason;
using recipe::OutputEvent;
using recipe::OutputParserOptions;
using recipe::ParseStart;
using testing::eos_id;
using testing::tok;

OutputParserOptions thinking_parser() {
  OutputParserOptions o;
  o.start = ParseStart::kReasoningStart;
  o.parse_tool_calls = true;
  return o;
}

std::vector<int32_t> ids(const std::string& text) {
  return tok().encode(text, /*allow_special=*/true).value();
}

std::string tool_call_text() {
  recipe::ToolCall call;
  call.name = "get_weather";
  call.arguments = R"({"city": "Paris", "days": 3})";
  return recipe::render_tool_calls({call}, recipe::ModelVersion::kV4);
}

// Feeds every id; returns the events of the whole run (finish() included).
std::vector<OutputEvent> run(OutputPipeline& p,
                             const std::vector<int32_t>& tokens,
                             FinishReason backend = FinishReason::kStop) {
  std::vector<OutputEvent> all;
  for (int32_t t : tokens) {
    p.feed(t);
    for (auto& e : p.take_events()) all.push_back(std::move(e));
  }
  p.finish(backend);
  for (auto& e : p.take_events()) all.push_back(std::move(e));
  return all;
}

// Ids of `text` with every byte as ordinary tokens (special-token spellings stay characters).
std::vector<int32_t> text_ids(const std::string& text) {
  return tok().encode(text, /*allow_special=*/false).value();
}

int32_t control_id(std::string_view spelling) {
  return *tok().added_token_id(spelling);
}

// The model writing a special-token spelling with ordinary tokens: it stays text; the same
// spelling as the control token is a marker.
TEST(OutputPipeline, SpecialTokenSpellingsFromOrdinaryTokensStayText) {
  const std::string think_end(recipe::tok::kThinkEnd), eos(recipe::tok::kEos);
  std::vector<int32_t> plain = text_ids("reason " + think_end + " still" + eos + " more");
  plain.push_back(control_id(recipe::tok::kThinkEnd));
  const std::vector<int32_t> answer = text_ids("answer");
  plain.insert(plain.end(), answer.begin(), answer.end());
  plain.push_back(eos_id());
  OutputPipeline p(tok(), thinking_parser());
  recipe::ParsedMessage m = recipe::aggregate_events(run(p, plain));
  EXPECT_EQ(m.reasoning, "reason " + think_end + " still" + eos + " more");
  EXPECT_EQ(m.content, "answer");

  // DSML spelled with ordinary tokens in the content: text, not a tool call.
  const std::string dsml_text = "x <" + std::string(recipe::tok::kDsml) + "tool_calls> y";
  std::vector<int32_t> ids2 = text_ids(dsml_text);
  ids2.push_back(eos_id());
  OutputParserOptions o;
  o.start = ParseStart::kContentStart;
  o.parse_tool_calls = true;
  OutputPipeline q(tok(), o);
  recipe::ParsedMessage m2 = recipe::aggregate_events(run(q, ids2));
  EXPECT_EQ(m2.content, dsml_text);
  EXPECT_TRUE(m2.tool_calls.empty());
}

TEST(OutputPipeline, ReasoningContentToolCallMatchesWholeTextParse) {
  const std::string text = "Let me think: weather needs a tool.</think>Checking.\n\n" +
                           tool_call_text() + std::string(recipe::tok::kEos);
  OutputPipeline p(tok(), thinking_parser());
  std::vector<OutputEvent> events = run(p, ids(text));
  recipe::ParsedMessage got = recipe::aggregate_events(events);
  recipe::ParsedMessage want = recipe::parse_completion(text, thinking_parser());
  EXPECT_EQ(got.reasoning, want.reasoning);
  EXPECT_EQ(got.reasoning, "Let me think: weather needs a tool.");
  EXPECT_EQ(got.content, "Checking.");
  ASSERT_EQ(got.tool_calls.size(), 1u);
  EXPECT_EQ(got.tool_calls[0].name, "get_weather");
  EXPECT_EQ(got.tool_calls[0].arguments, want.tool_calls[0].arguments);
  EXPECT_EQ(got.finish, FinishReason::kToolCalls);
  EXPECT_TRUE(p.done());
  // Reasoning tokens: those of the reasoning text plus the closing </think>.
  const int64_t reasoning = static_cast<int64_t>(ids("Let me think: weather needs a tool.").size());
  EXPECT_GE(p.reasoning_tokens(), reasoning);
  EXPECT_LE(p.reasoning_tokens(), reasoning + 1);
  EXPECT_EQ(p.tokens(), static_cast<int64_t>(ids(text).size()));
}

TEST(OutputPipeline, LogprobsCoverExactlyTheContentTokens) {
  // Reasoning, </think>, content, a tool call, EOS: only the content tokens are reported, in
  // order, each with the bytes of the token fed and the logprob given after it.
  const std::string reasoning = "Let me think.";
  const std::string content = "Checking the weather now.";
  const std::string text =
      reasoning + "</think>" + content + "\n\n" + tool_call_text() + std::string(recipe::tok::kEos);
  OutputPipeline p(tok(), thinking_parser());
  p.set_report_logprobs(true);
  std::vector<OutputEvent> all;
  const std::vector<int32_t> t = ids(text);
  for (size_t i = 0; i < t.size(); ++i) {
    p.feed(t[i]);
    p.logprobs(-static_cast<float>(i), {{t[i], -0.5f}, {7, -1.5f}});
    for (auto& e : p.take_events()) all.push_back(std::move(e));
  }
  p.finish(FinishReason::kStop);
  for (auto& e : p.take_events()) all.push_back(std::move(e));
  std::string bytes;
  std::vector<float> lps;
  for (const OutputEvent& e : all) {
    if (!e.logprobs.empty()) {
      EXPECT_TRUE(e.type == OutputEvent::Type::kContentDelta ||
                  e.type == OutputEvent::Type::kFinish);
    }
    for (const recipe::TokenLogprob& l : e.logprobs) {
      bytes += l.bytes;
      lps.push_back(l.logprob);
      ASSERT_EQ(l.top.size(), 2u);
      EXPECT_EQ(l.top[0].bytes, l.bytes);
      EXPECT_EQ(l.top[1].bytes, std::string(tok().token_bytes(7)));
    }
  }
  // The content text (the newlines before the tool block are held and then dropped with it, so
  // their tokens may be reported too).
  EXPECT_EQ(bytes.substr(0, content.size()), content);
  EXPECT_EQ(bytes.find_first_not_of('\n', content.size()), std::string::npos);
  const size_t first = ids(reasoning + "</think>").size();
  ASSERT_FALSE(lps.empty());
  EXPECT_EQ(lps[0], -static_cast<float>(first));
  for (size_t i = 1; i < lps.size(); ++i) EXPECT_EQ(lps[i], lps[i - 1] - 1.0f);
}

TEST(OutputPipeline, NoLogprobsUnlessAsked) {
  OutputParserOptions o;
  o.start = ParseStart::kContentStart;
  OutputPipeline p(tok(), o);
  for (int32_t t : ids("Hello there")) {
    p.feed(t);
    p.logprobs(-1.0f, {});
  }
  p.finish(FinishReason::kStop);
  for (const OutputEvent& e : p.take_events()) EXPECT_TRUE(e.logprobs.empty());
}

TEST(OutputPipeline, EndsAtEosAndIgnoresLaterTokens) {
  OutputParserOptions o;
  o.start = ParseStart::kContentStart;
  OutputPipeline p(tok(), o);
  bool done = false;
  for (int32_t t : ids("Hello")) done = p.feed(t);
  EXPECT_FALSE(done);
  EXPECT_TRUE(p.feed(testing::eos_id()));
  EXPECT_TRUE(p.feed(ids("x")[0]));  // ignored
  p.finish(FinishReason::kStop);
  recipe::ParsedMessage m = recipe::aggregate_events(p.take_events());
  EXPECT_EQ(m.content, "Hello");
  EXPECT_EQ(m.finish, FinishReason::kStop);
  EXPECT_EQ(p.reasoning_tokens(), 0);
}

TEST(OutputPipeline, StopSequenceEndsOutputInContentOnly) {
  OutputParserOptions o = thinking_parser();
  o.stop_sequences = {"STOP"};
  OutputPipeline p(tok(), o);
  bool done_at_stop = false;
  for (int32_t t : ids("no STOP in reasoning</think>one two STOP three")) {
    if (p.feed(t)) {
      done_at_stop = true;
      break;
    }
  }
  EXPECT_TRUE(done_at_stop);
  p.finish(FinishReason::kStop);
  recipe::ParsedMessage m = recipe::aggregate_events(p.take_events());
  EXPECT_EQ(m.reasoning, "no STOP in reasoning");
  EXPECT_EQ(m.content, "one two ");
  EXPECT_EQ(m.finish, FinishReason::kStopSequence);
  EXPECT_EQ(m.stop_sequence, "STOP");
}

TEST(OutputPipeline, MultiByteCharactersSplitAcrossTokensStayValidUtf8) {
  OutputParserOptions o;
  o.start = ParseStart::kContentStart;
  OutputPipeline p(tok(), o);
  const std::string text = "héllo wörld 你好 🙂";
  std::vector<OutputEvent> events = run(p, ids(text));
  std::string joined;
  for (const auto& e : events) {
    if (e.type == OutputEvent::Type::kContentDelta) {
      // Every delta is valid UTF-8 on its own: no lead byte without its continuation bytes.
      int need = 0;
      for (unsigned char c : e.text) {
        if (need > 0) {
          EXPECT_EQ(c & 0xC0, 0x80);
          --need;
        } else if (c >= 0xF0) {
          need = 3;
        } else if (c >= 0xE0) {
          need = 2;
        } else if (c >= 0xC0) {
          need = 1;
        }
      }
      EXPECT_EQ(need, 0) << e.text;
      joined += e.text;
    }
  }
  EXPECT_EQ(joined, text);
}

TEST(OutputPipeline, LengthFinishCompletesAnOpenToolCall) {
  const std::string text = "</think>" + tool_call_text();
  std::vector<int32_t> all = ids(text);
  all.resize(all.size() - 6);  // cut inside the call
  OutputPipeline p(tok(), thinking_parser());
  recipe::ParsedMessage m = recipe::aggregate_events(run(p, all, FinishReason::kLength));
  EXPECT_EQ(m.finish, FinishReason::kLength);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments.front(), '{');
  EXPECT_EQ(m.tool_calls[0].arguments.back(), '}');
}

TEST(OutputPipeline, ScriptReplacesSampledTokens) {
  OutputParserOptions o;
  o.start = ParseStart::kContentStart;
  OutputPipeline p(tok(), o, testing::script_ids("scripted answer"));
  bool done = false;
  int fed = 0;
  while (!done && fed < 100) {
    done = p.feed(ids("z")[0]);  // whatever the model sampled
    ++fed;
  }
  EXPECT_TRUE(done);
  p.finish(FinishReason::kStop);
  EXPECT_EQ(recipe::aggregate_events(p.take_events()).content, "scripted answer");
  EXPECT_EQ(fed, static_cast<int>(testing::script_ids("scripted answer").size()));
}

TEST(OutputPipeline, FinishIsIdempotentAndAbortedReasonSurvives) {
  OutputParserOptions o;
  o.start = ParseStart::kContentStart;
  OutputPipeline p(tok(), o);
  for (int32_t t : ids("partial")) p.feed(t);
  p.finish(FinishReason::kAborted);
  p.finish(FinishReason::kStop);
  std::vector<OutputEvent> events = p.take_events();
  int finishes = 0;
  for (const auto& e : events) finishes += e.type == OutputEvent::Type::kFinish;
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(p.finish_reason(), FinishReason::kAborted);
}

recipe::GenerationRequest request_with_user(const std::string& text) {
  recipe::GenerationRequest r;
  recipe::Message m;
  m.role = recipe::Role::kUser;
  m.content = text;
  r.conversation.messages.push_back(m);
  return r;
}

TEST(ScriptedOutputs, SelectsByLastUserMessageAndEchoes) {
  auto s = ScriptedOutputs::from_json(
      R"({"rules":[{"match":"[[tool]]","output":"A</think>B"},
                   {"match":"[[echo]]","output":"echo: {last_user}"}]})",
      tok(),
      testing::eos_id());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_FALSE((*s)->select(request_with_user("nothing")).has_value());
  auto a = (*s)->select(request_with_user("x [[tool]] y"));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->back(), testing::eos_id());
  auto b = (*s)->select(request_with_user("[[echo]] 42"));
  ASSERT_TRUE(b.has_value());
  std::vector<int32_t> text(b->begin(), b->end() - 1);
  EXPECT_EQ(tok().decode(text).value(), "echo: [[echo]] 42");

  recipe::GenerationRequest blocks;
  recipe::Message m;
  m.role = recipe::Role::kUser;
  recipe::ContentBlock part;
  part.text = "[[to";
  m.blocks.push_back(part);
  part.text = "ol]]";
  m.blocks.push_back(part);
  blocks.conversation.messages.push_back(m);
  EXPECT_EQ(last_input_text(blocks.conversation), "[[tool]]");
  EXPECT_TRUE((*s)->select(blocks).has_value());
}

TEST(ScriptedOutputs, RejectsMalformedFiles) {
  for (const char* bad : {"",
                          "[]",
                          "{\"rules\":{}}",
                          "{\"rules\":[{\"match\":1,\"output\":\"x\"}]}",
                          "{\"rules\":[{\"match\":\"a\"}]}"}) {
    EXPECT_FALSE(ScriptedOutputs::from_json(bad, tok(), 1).ok()) << bad;
  }
  EXPECT_FALSE(ScriptedOutputs::load("/nonexistent/rules.json", tok(), 1).ok());
}

// Structured outputs constrain the answer only: while the output is in its thinking block every
// token is allowed (so `</think>` can close it); from the first answer token the grammar decides.
TEST(GrammarTokenMaskTest, ConstrainsOnlyTheAnswer) {
  if (!grammar::available())
    GTEST_SKIP() << "built without XGrammar";
  const int32_t vocab = tok().vocab_size();
  auto compiler = grammar::Compiler::create(tok(), vocab, {eos_id()});
  ASSERT_TRUE(compiler.ok()) << compiler.status().to_string();
  auto g = (*compiler)->compile({grammar::Kind::kRegex, "[0-9]+"});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto m = grammar::Matcher::create(*g);
  ASSERT_TRUE(m.ok());
  OutputPipeline p(tok(), thinking_parser());
  GrammarTokenMask mask(std::move(m).value(), &p);
  std::vector<uint32_t> bits(grammar::mask_words(vocab));
  auto step = [&](int32_t token) {
    bits.assign(bits.size(), 0u);
    const bool masked = mask.fill(bits);
    mask.accept(token);
    p.feed(token);
    return masked;
  };
  for (int32_t t : text_ids("let me think")) EXPECT_FALSE(step(t));
  EXPECT_FALSE(step(control_id("</think>")));  // the reasoning's closing token is free
  EXPECT_TRUE(p.answering());
  const std::vector<int32_t> digits = text_ids("42");
  bits.assign(bits.size(), 0u);
  ASSERT_TRUE(mask.fill(bits));
  EXPECT_TRUE(grammar::mask_allows(bits, digits[0]));
  EXPECT_FALSE(grammar::mask_allows(bits, text_ids("x")[0]));
  EXPECT_FALSE(grammar::mask_allows(bits, eos_id()));  // empty is no match of [0-9]+
  mask.accept(digits[0]);
  p.feed(digits[0]);
  for (size_t i = 1; i < digits.size(); ++i) EXPECT_TRUE(step(digits[i]));
  EXPECT_TRUE(mask.matcher().completed());
  bits.assign(bits.size(), 0u);
  ASSERT_TRUE(mask.fill(bits));
  EXPECT_TRUE(grammar::mask_allows(bits, eos_id()));
}

// Strict tools: reasoning and content are free; the DSML token the model writes to open the tool
// block switches the grammar on, and the recipe's block for a valid call passes the mask token by
// token (the pipeline reads the call from it); when the prompt opened the block, the grammar is on
// from the first token and refuses arguments outside the schema.
TEST(ToolCallTokenMaskTest, SwitchesOnAtTheDsmlToken) {
  if (!grammar::available())
    GTEST_SKIP() << "built without XGrammar";
  const int32_t vocab = tok().vocab_size();
  const int32_t dsml = control_id(grammar::kDsmlMarker);
  auto compiler = grammar::Compiler::create(tok(), vocab, {eos_id()}, 2, {dsml});
  ASSERT_TRUE(compiler.ok()) << compiler.status().to_string();
  auto compile = [&](bool opened) {
    grammar::DsmlToolCalls calls;
    calls.opened_by_prompt = opened;
    calls.tools.push_back(
        {"get_weather", std::string(R"({"type": "object", "properties": {"city": {"type": "string"},
             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
             "required": ["city", "days"], "additionalProperties": false})")});
    auto spec = grammar::dsml_tool_calls_spec(calls);
    EXPECT_TRUE(spec.ok());
    auto g = (*compiler)->compile(*spec);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return std::move(g).value();
  };
  std::vector<uint32_t> bits(grammar::mask_words(vocab));
  {
    OutputPipeline p(tok(), thinking_parser());
    ToolCallTokenMask mask(grammar::Matcher::create(compile(false)).value(), dsml, false, nullptr);
    std::vector<int32_t> out;
    auto step = [&](int32_t token) {
      bits.assign(bits.size(), 0u);
      const bool masked = mask.fill(bits);
      EXPECT_TRUE(!masked || grammar::mask_allows(bits, token)) << token;
      mask.accept(token);
      p.feed(token);
      out.push_back(token);
      return masked;
    };
    for (int32_t t : text_ids("I should call it.")) EXPECT_FALSE(step(t));
    EXPECT_FALSE(step(control_id("</think>")));
    const std::vector<int32_t> block = ids(tool_call_text());
    bool on = false;
    for (int32_t t : block) {
      const bool masked = step(t);
      EXPECT_EQ(masked, on) << t;  // free up to and including the DSML token itself
      on = on || t == dsml;
    }
    EXPECT_TRUE(mask.in_block());
    EXPECT_TRUE(mask.matcher().completed());
    bits.assign(bits.size(), 0u);
    ASSERT_TRUE(mask.fill(bits));
    EXPECT_TRUE(grammar::mask_allows(bits, eos_id()));
    EXPECT_TRUE(p.done());
    p.finish(FinishReason::kStop);
    const recipe::ParsedMessage msg = recipe::aggregate_events(p.take_events());
    ASSERT_EQ(msg.tool_calls.size(), 1u);
    EXPECT_EQ(msg.tool_calls[0].arguments, R"({"city": "Paris", "days": 3})");
  }
  {
    // Opened by the prompt: masked from the first token; an out-of-range `days` is refused.
    ToolCallTokenMask mask(grammar::Matcher::create(compile(true)).value(), dsml, true, nullptr);
    const std::string head =
        "<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Rome"
        "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" "
        "string=\"false\">";
    for (int32_t t : ids(head)) {
      bits.assign(bits.size(), 0u);
      ASSERT_TRUE(mask.fill(bits));
      ASSERT_TRUE(grammar::mask_allows(bits, t)) << t;
      mask.accept(t);
    }
    bits.assign(bits.size(), 0u);
    ASSERT_TRUE(mask.fill(bits));
    EXPECT_TRUE(grammar::mask_allows(bits, text_ids("3")[0]));
    EXPECT_FALSE(grammar::mask_allows(bits, text_ids("9")[0]));
    EXPECT_FALSE(grammar::mask_allows(bits, text_ids("x")[0]));
  }
}

}  // namespace
}  // namespace dsinfer::server
