// Strict tool calls (grammar/tool_calls.h) over the bundled model's tokenizer: the DSML block the
// recipe documents is accepted token by token through the mask, the marker is only ever the DSML
// token, arguments outside the schema are refused, and random walks under the mask give blocks
// the output parser reads into arguments that match their schema.
#include "grammar/tool_calls.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "recipe/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::grammar {
namespace {

#if DSINFER_HAVE_XGRAMMAR

const std::string kModelDir = std::string(DSI_SOURCE_DIR) + "/models/dsv4-mini";

const char* kWeather = R"({"type": "object", "properties": {
    "location": {"type": "string"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
  "required": ["location", "unit"], "additionalProperties": false})";

class ToolCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = tokenizer::Tokenizer::load(kModelDir + "/tokenizer.json");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    tok_ = std::move(t).value();
    eos_ = *tok_->added_token_id("<｜end▁of▁sentence｜>");
    dsml_ = *tok_->added_token_id(kDsmlMarker);
    auto c = Compiler::create(*tok_, kVocab, {eos_}, 2, {dsml_});
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    compiler_ = std::move(c).value();
  }

  std::unique_ptr<Matcher> matcher(const DsmlToolCalls& calls) {
    auto spec = dsml_tool_calls_spec(calls);
    EXPECT_TRUE(spec.ok()) << spec.status().to_string();
    if (!spec.ok())
      return nullptr;
    auto g = compiler_->compile(*spec);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    if (!g.ok())
      return nullptr;
    auto m = Matcher::create(*g);
    return m.ok() ? std::move(m).value() : nullptr;
  }

  // Feeds `text` (control tokens spelled as themselves), checking each token against the mask.
  // Returns how many tokens were accepted before the first refused one.
  size_t feed(Matcher& m, const std::string& text, size_t* total = nullptr) {
    auto ids = tok_->encode(text, /*allow_special=*/true);
    EXPECT_TRUE(ids.ok());
    if (total)
      *total = ids->size();
    std::vector<uint32_t> bits(mask_words(kVocab));
    size_t n = 0;
    for (int32_t id : *ids) {
      bits.assign(bits.size(), 0u);
      const bool need = m.fill_mask(bits);
      const bool allowed = !need || mask_allows(bits, id);
      const bool accepted = m.accept(id).ok();
      EXPECT_EQ(allowed, accepted) << "token " << id << " in " << text;
      if (!accepted)
        break;
      ++n;
    }
    return n;
  }
  bool feeds_whole(Matcher& m, const std::string& text) {
    size_t total = 0;
    return feed(m, text, &total) == total;
  }

  static constexpr int32_t kVocab = 8192;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Compiler> compiler_;
  int32_t eos_ = -1;
  int32_t dsml_ = -1;
};

DsmlToolCalls weather_tools(bool v41 = false, bool opened = false) {
  DsmlToolCalls c;
  c.v41 = v41;
  c.opened_by_prompt = opened;
  c.tools.push_back({"get_weather", std::string(kWeather)});
  c.tools.push_back({"free_tool", std::nullopt});
  return c;
}

// The block as the recipe renders it (spec 1.7), after the `<` the content ends with.
const std::string kGoldBlock =
    "｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"location\" string=\"true\">Beijing</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"unit\" string=\"true\">celsius</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

TEST_F(ToolCallsTest, RecipeBlockIsAcceptedThenOnlyEos) {
  auto m = matcher(weather_tools());
  ASSERT_TRUE(m);
  EXPECT_TRUE(feeds_whole(*m, kGoldBlock));
  EXPECT_TRUE(m->completed());
  std::vector<uint32_t> bits(mask_words(kVocab));
  ASSERT_TRUE(m->fill_mask(bits));
  int allowed = 0;
  for (int32_t t = 0; t < kVocab; ++t) allowed += mask_allows(bits, t);
  EXPECT_EQ(allowed, 1);
  EXPECT_TRUE(mask_allows(bits, eos_));
}

TEST_F(ToolCallsTest, NonStringAndSeveralInvokes) {
  auto m = matcher(weather_tools());
  ASSERT_TRUE(m);
  EXPECT_TRUE(feeds_whole(
      *m,
      "｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"location\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"unit\" string=\"true\">fahrenheit</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"free_tool\">\n"
      "<｜DSML｜parameter name=\"anything\" string=\"false\">{\"a\": [1, 2]}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"));
  EXPECT_TRUE(m->completed());
}

// parallel_tool_calls false: one invoke, then only the block's closing tag.
TEST_F(ToolCallsTest, SingleCallAllowsOneInvoke) {
  const std::string first =
      "｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"location\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"unit\" string=\"true\">celsius</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n";
  DsmlToolCalls one = weather_tools();
  one.single_call = true;
  auto m = matcher(one);
  ASSERT_TRUE(m);
  EXPECT_TRUE(feeds_whole(*m, first + "</｜DSML｜tool_calls>"));
  EXPECT_TRUE(m->completed());
  m = matcher(one);
  ASSERT_TRUE(m);
  EXPECT_FALSE(feeds_whole(*m, first + "<｜DSML｜invoke name=\"free_tool\">\n</｜DSML｜invoke>\n"));
  // Without single_call the second invoke is allowed.
  m = matcher(weather_tools());
  ASSERT_TRUE(m);
  EXPECT_TRUE(feeds_whole(*m,
                          first + "<｜DSML｜invoke name=\"free_tool\">\n</｜DSML｜invoke>\n"
                                  "</｜DSML｜tool_calls>"));
  // V4.1 spellings: the first invoke is accepted whole, a second one is refused.
  DsmlToolCalls one41 = weather_tools(/*v41=*/true);
  one41.single_call = true;
  m = matcher(one41);
  ASSERT_TRUE(m);
  EXPECT_TRUE(feeds_whole(*m,
                          "｜DSML｜ calls>\n<｜DSML｜ invoke name=\"free_tool\">\n</｜DSML｜ "
                          "invoke>\n"));
  EXPECT_FALSE(feeds_whole(*m, "<｜DSML｜ invoke name=\"free_tool\">\n"));
}

TEST_F(ToolCallsTest, ArgumentsOutsideTheSchemaAreRefused) {
  const std::string head = "｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n";
  const std::string loc =
      "<｜DSML｜parameter name=\"location\" string=\"true\">Rome</｜DSML｜parameter>\n";
  for (const std::string& bad : {
           // an enum value the schema does not list
           head + loc + "<｜DSML｜parameter name=\"unit\" string=\"true\">kelvin",
           // a property the schema does not declare
           head + "<｜DSML｜parameter name=\"city\"",
           // an integer out of range
           head + loc +
               "<｜DSML｜parameter name=\"unit\" string=\"true\">celsius</｜DSML｜parameter>\n"
               "<｜DSML｜parameter name=\"days\" string=\"false\">9",
           // a required property missing at the invoke's end
           head + loc + "</｜DSML｜invoke>",
           // an undeclared tool
           std::string("｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"rm_rf\""),
       }) {
    auto m = matcher(weather_tools());
    ASSERT_TRUE(m);
    size_t total = 0;
    EXPECT_LT(feed(*m, bad, &total), total) << bad;
  }
}

TEST_F(ToolCallsTest, MarkerTextComesOnlyFromTheMarkerToken) {
  auto m = matcher(weather_tools());
  ASSERT_TRUE(m);
  // Inside a raw string value: the marker token may close it (`</｜DSML｜parameter>`), but no
  // ordinary token may write `｜` (or a piece of it).
  ASSERT_TRUE(feeds_whole(*m,
                          "｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                          "<｜DSML｜parameter name=\"location\" string=\"true\">Be</"));
  std::vector<uint32_t> bits(mask_words(kVocab));
  ASSERT_TRUE(m->fill_mask(bits));
  EXPECT_TRUE(mask_allows(bits, dsml_));
  const std::string bar = "｜";
  for (int32_t t = 0; t < kVocab; ++t) {
    if (t == dsml_ || !mask_allows(bits, t))
      continue;
    EXPECT_FALSE(tok_->is_added(t)) << t;
    const std::string_view b = tok_->token_bytes(t);
    EXPECT_EQ(b.find(bar), std::string_view::npos) << t;
    EXPECT_FALSE(b.ends_with(bar.substr(0, 1))) << t;
    EXPECT_FALSE(b.ends_with(bar.substr(0, 2))) << t;
  }
}

TEST_F(ToolCallsTest, PromptOpenedBlockAndV41Spellings) {
  auto m = matcher(weather_tools(/*v41=*/false, /*opened=*/true));
  ASSERT_TRUE(m);
  EXPECT_TRUE(feeds_whole(*m, kGoldBlock.substr(std::string("｜DSML｜tool_calls>\n").size())));
  EXPECT_TRUE(m->completed());

  auto m41 = matcher(weather_tools(/*v41=*/true));
  ASSERT_TRUE(m41);
  EXPECT_TRUE(feeds_whole(
      *m41,
      "｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
      "<｜DSML｜ parameter name=\"location\" string=\"true\">Oslo</｜DSML｜ parameter>\n"
      "<｜DSML｜ parameter name=\"unit\" string=\"true\">celsius</｜DSML｜ parameter>\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>"));
  EXPECT_TRUE(m41->completed());
}

TEST_F(ToolCallsTest, BadToolsAreErrors) {
  DsmlToolCalls none;
  EXPECT_FALSE(dsml_tool_calls_spec(none).ok());
  DsmlToolCalls quote;
  quote.tools.push_back({"a\"b", std::nullopt});
  EXPECT_FALSE(dsml_tool_calls_spec(quote).ok());
  DsmlToolCalls bad_schema;
  bad_schema.tools.push_back({"f", std::string("[1, 2]")});
  EXPECT_FALSE(dsml_tool_calls_spec(bad_schema).ok());
  DsmlToolCalls not_utf8;
  not_utf8.tools.push_back({"f\xff", std::nullopt});
  EXPECT_FALSE(dsml_tool_calls_spec(not_utf8).ok());
  DsmlToolCalls deep;
  deep.tools.push_back({"f", std::string(200, '[') + std::string(200, ']')});
  EXPECT_FALSE(dsml_tool_calls_spec(deep).ok());
  DsmlToolCalls wont_compile;
  wont_compile.tools.push_back({"f", std::string(R"({"type": "no-such-type"})")});
  auto spec = dsml_tool_calls_spec(wont_compile);
  ASSERT_TRUE(spec.ok());
  auto g = compiler_->compile(*spec);
  EXPECT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
}

// Random walks under the mask: every finished block parses (recipe output parser) into calls of
// the declared tool whose arguments satisfy the schema.
TEST_F(ToolCallsTest, RandomWalksParseIntoValidArguments) {
  DsmlToolCalls calls;
  calls.tools.push_back({"get_weather", std::string(kWeather)});
  std::mt19937 rng(11);
  int finished = 0;
  for (int walk = 0; walk < 12; ++walk) {
    auto m = matcher(calls);
    ASSERT_TRUE(m);
    std::vector<uint32_t> bits(mask_words(kVocab));
    std::vector<int32_t> out = *tok_->encode("\n\n<", false);
    const size_t prefix = out.size();
    ASSERT_TRUE(m->accept(dsml_).ok());  // the model opened the block
    out.push_back(dsml_);
    for (int step = 0; step < 400 && !m->completed(); ++step) {
      ASSERT_TRUE(m->fill_mask(bits));
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < kVocab; ++t) {
        if (mask_allows(bits, t))
          allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty()) << *tok_->decode(out);
      // Short values: most of the time, take markup (`<`, `</`, the marker) when it is allowed.
      // ASCII text only (a byte-level walk would leave UTF-8 characters unfinished).
      std::vector<int32_t> markup, ascii;
      for (int32_t a : allowed) {
        const std::string_view b = tok_->token_bytes(a);
        if (a == dsml_ || b.starts_with("<"))
          markup.push_back(a);
        if (a == dsml_ || std::all_of(b.begin(), b.end(), [](char c) { return c > 0; }))
          ascii.push_back(a);
      }
      const std::vector<int32_t>& pool =
          !markup.empty() && rng() % 4 != 0 ? markup : (!ascii.empty() ? ascii : allowed);
      const int32_t t = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
      ASSERT_TRUE(m->accept(t).ok());
      out.push_back(t);
    }
    if (!m->completed())
      continue;
    ++finished;
    ASSERT_GT(out.size(), prefix);
    out.push_back(eos_);
    recipe::OutputParserOptions o;
    o.start = recipe::ParseStart::kContentStart;
    recipe::OutputParser parser(o);
    std::vector<recipe::OutputEvent> evs;
    for (int32_t t : out) {
      auto e = parser.feed(tok_->token_bytes(t),
                           tok_->is_added(t) ? recipe::OutputParser::Kind::kControl
                                             : recipe::OutputParser::Kind::kText);
      evs.insert(evs.end(), e.begin(), e.end());
    }
    auto fin = parser.finish(recipe::FinishReason::kStop);
    evs.insert(evs.end(), fin.begin(), fin.end());
    const recipe::ParsedMessage msg = recipe::aggregate_events(evs);
    const std::string text = *tok_->decode(out);
    ASSERT_FALSE(msg.tool_calls.empty()) << text;
    EXPECT_EQ(msg.finish, recipe::FinishReason::kToolCalls) << text;
    for (const recipe::ParsedToolCall& c : msg.tool_calls) {
      EXPECT_EQ(c.name, "get_weather");
      auto j = nlohmann::json::parse(c.arguments, nullptr, false);
      ASSERT_TRUE(j.is_object()) << c.arguments << "\n" << text;
      ASSERT_TRUE(j.contains("location") && j["location"].is_string()) << c.arguments;
      ASSERT_TRUE(j.contains("unit")) << c.arguments;
      EXPECT_TRUE(j["unit"] == "celsius" || j["unit"] == "fahrenheit") << c.arguments;
      for (const auto& [k, v] : j.items()) {
        EXPECT_TRUE(k == "location" || k == "unit" || k == "days") << c.arguments;
        if (k == "days") {
          ASSERT_TRUE(v.is_number_integer()) << c.arguments;
          EXPECT_GE(v.get<int>(), 1);
          EXPECT_LE(v.get<int>(), 7);
        }
      }
    }
  }
  EXPECT_GT(finished, 0);
}

#else

// Without a grammar engine the block's spec is still built (it is only JSON); compiling it is
// kUnimplemented, which the server answers with a 400.
TEST(ToolCallsTest, SpecWithoutXGrammar) {
  DsmlToolCalls calls;
  calls.tools.push_back({"f", std::string(R"({"type": "object"})")});
  auto spec = dsml_tool_calls_spec(calls);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->kind, Kind::kStructuralTag);
  EXPECT_FALSE(available());
}

#endif

}  // namespace
}  // namespace dsinfer::grammar
