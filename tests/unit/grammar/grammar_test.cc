// src/grammar over the bundled model's tokenizer (models/dsv4-mini, 8192 tokens): compile errors
// as values, masks that admit exactly the grammar's continuations, acceptance, completion,
// rollback and the compile cache. Without XGrammar in the build, only the "unavailable" answer
// is checked.
#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dsinfer::grammar {
namespace {

const std::string kModelDir = std::string(DSI_SOURCE_DIR) + "/models/dsv4-mini";

class GrammarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = tokenizer::Tokenizer::load(kModelDir + "/tokenizer.json");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    tok_ = std::move(t).value();
    eos_ = *tok_->added_token_id("<｜end▁of▁sentence｜>");
    auto c = Compiler::create(*tok_, kVocab, {eos_});
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    compiler_ = std::move(c).value();
  }

  std::unique_ptr<Matcher> matcher(Kind kind, const std::string& text) {
    auto g = compiler_->compile({kind, text});
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    if (!g.ok())
      return nullptr;
    auto m = Matcher::create(*g);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? std::move(m).value() : nullptr;
  }

  // Feeds `text`'s tokens, checking that each mask allows the token. Returns how many were
  // accepted before the first the grammar refused.
  size_t feed(Matcher& m, const std::string& text) {
    auto ids = tok_->encode(text);
    EXPECT_TRUE(ids.ok());
    std::vector<uint32_t> bits(mask_words(kVocab));
    size_t n = 0;
    for (int32_t id : *ids) {
      bits.assign(bits.size(), 0u);
      const bool need = m.fill_mask(bits);
      const bool allowed = !need || mask_allows(bits, id);
      const bool accepted = m.accept(id).ok();
      EXPECT_EQ(allowed, accepted) << "token " << id << " of " << text;
      if (!accepted)
        break;
      ++n;
    }
    return n;
  }

  static constexpr int32_t kVocab = 8192;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Compiler> compiler_;
  int32_t eos_ = -1;
};

#if DSINFER_HAVE_XGRAMMAR

TEST_F(GrammarTest, Available) {
  EXPECT_TRUE(available());
}

TEST_F(GrammarTest, BadSpecsAreErrorsNotExceptions) {
  for (const Spec& s : std::vector<Spec>{{Kind::kJsonSchema, "{not json"},
                                         {Kind::kJsonSchema, R"({"type": "no-such-type"})"},
                                         {Kind::kRegex, "(unclosed"},
                                         {Kind::kRegex, "a{3,1}"},
                                         {Kind::kRegex, "(a)\\1"},
                                         {Kind::kRegex, "(?=a)a"},
                                         {Kind::kEbnf, "root ::= undefined_rule"},
                                         {Kind::kEbnf, "this is not ebnf"}}) {
    auto g = compiler_->compile(s);
    EXPECT_FALSE(g.ok()) << kind_name(s.kind) << ": " << s.text;
    if (!g.ok()) {
      EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(g.status().message().find(kind_name(s.kind)), std::string::npos)
          << g.status().message();
      // XGrammar's message, without its timestamp and source location.
      EXPECT_EQ(g.status().message().find(".cc:"), std::string::npos) << g.status().message();
      EXPECT_EQ(g.status().message().find("] "), std::string::npos) << g.status().message();
    }
  }
  // The compiler still works after the failures.
  EXPECT_TRUE(compiler_->compile({Kind::kRegex, "[a-c]+"}).ok());
  EXPECT_FALSE(compiler_->compile({Kind::kRegex, std::string(300000, 'a')}).ok());
}

TEST_F(GrammarTest, CacheReturnsTheSameGrammar) {
  auto a = compiler_->compile({Kind::kRegex, "[0-9]+"});
  auto b = compiler_->compile({Kind::kRegex, "[0-9]+"});
  auto c = compiler_->compile({Kind::kRegex, "[0-9]*"});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_NE(a->get(), c->get());
  EXPECT_EQ(compiler_->cache_entries(), 2u);
}

TEST_F(GrammarTest, JsonSchemaAcceptsValidAndRefusesInvalid) {
  const std::string schema =
      R"({"type": "object", "properties": {"name": {"type": "string"},
          "age": {"type": "integer"}}, "required": ["name", "age"]})";
  auto m = matcher(Kind::kJsonSchema, schema);
  ASSERT_TRUE(m);
  const std::string ok = R"({"name": "Bob", "age": 3})";
  EXPECT_EQ(feed(*m, ok), tok_->encode(ok)->size());
  EXPECT_TRUE(m->completed());
  // Complete: only EOS may follow.
  std::vector<uint32_t> bits(mask_words(kVocab));
  EXPECT_TRUE(m->fill_mask(bits));
  int allowed = 0;
  for (int32_t t = 0; t < kVocab; ++t) allowed += mask_allows(bits, t);
  EXPECT_EQ(allowed, 1);
  EXPECT_TRUE(mask_allows(bits, eos_));
  EXPECT_TRUE(m->accept(eos_).ok());
  EXPECT_TRUE(m->terminated());

  auto m2 = matcher(Kind::kJsonSchema, schema);
  ASSERT_TRUE(m2);
  const std::string bad = R"({"name": "Bob", "age": "3"})";  // age is no integer
  EXPECT_LT(feed(*m2, bad), tok_->encode(bad)->size());
  EXPECT_FALSE(m2->completed());
}

TEST_F(GrammarTest, MaskNeverAllowsControlTokensInsideTheGrammar) {
  auto m = matcher(Kind::kJsonObject, "");
  ASSERT_TRUE(m);
  std::vector<uint32_t> bits(mask_words(kVocab));
  ASSERT_TRUE(m->fill_mask(bits));
  for (const auto& a : tok_->added_tokens()) {
    if (a.id < kVocab) {
      EXPECT_FALSE(mask_allows(bits, a.id)) << a.content;
    }
  }
  // The first token must start an object.
  int allowed = 0;
  for (int32_t t = 0; t < kVocab; ++t) {
    if (mask_allows(bits, t)) {
      ++allowed;
      EXPECT_EQ(tok_->token_bytes(t).substr(0, 1), "{") << t;
    }
  }
  EXPECT_GT(allowed, 0);
}

TEST_F(GrammarTest, RegexAndRollback) {
  auto m = matcher(Kind::kRegex, "[0-9]{3}-[a-z]+");
  ASSERT_TRUE(m);
  EXPECT_EQ(feed(*m, "123-abc"), tok_->encode("123-abc")->size());
  EXPECT_TRUE(m->completed());
  const size_t n = tok_->encode("abc")->size();
  ASSERT_TRUE(m->rollback(static_cast<int>(n)).ok());
  EXPECT_FALSE(m->completed());  // back at "123-"
  EXPECT_EQ(feed(*m, "xyz"), tok_->encode("xyz")->size());
  EXPECT_TRUE(m->completed());

  auto m2 = matcher(Kind::kRegex, "[0-9]{3}-[a-z]+");
  ASSERT_TRUE(m2);
  EXPECT_LT(feed(*m2, "12a"), tok_->encode("12a")->size());
  EXPECT_FALSE(m2->completed());
}

TEST_F(GrammarTest, EbnfGrammar) {
  auto m = matcher(Kind::kEbnf, R"(root ::= "yes" | "no")");
  ASSERT_TRUE(m);
  EXPECT_EQ(feed(*m, "no"), tok_->encode("no")->size());
  EXPECT_TRUE(m->completed());
}

// `format: email` compiles to RFC-bounded addresses; literal values and non-JSON are untouched.
TEST_F(GrammarTest, EmailFormatIsBounded) {
  const std::string schema =
      R"({"type": "object", "properties": {"e": {"type": "string", "format": "email"},
          "c": {"const": {"format": "email"}}}, "required": ["e"]})";
  auto j = nlohmann::json::parse(bounded_schema(schema));
  EXPECT_FALSE(j["properties"]["e"].contains("format"));
  EXPECT_TRUE(j["properties"]["e"].contains("pattern"));
  EXPECT_EQ(j["properties"]["c"]["const"]["format"], "email");
  EXPECT_EQ(bounded_schema("{not json"), "{not json");
  const std::string deep = std::string(200, '[') + std::string(200, ']');
  EXPECT_EQ(bounded_schema(deep), deep);
  EXPECT_EQ(json_nesting(R"({"a": "[[[{", "b": [[1]]})"), 3u);

  const std::string email = R"({"type": "string", "format": "email"})";
  auto ok = matcher(Kind::kJsonSchema, email);
  ASSERT_TRUE(ok);
  const std::string addr = R"("john.doe@mail.example.com")";
  EXPECT_EQ(feed(*ok, addr), tok_->encode(addr)->size());
  EXPECT_TRUE(ok->completed());
  // A 64-byte label is over the limit; so is a fifth label.
  for (const std::string& bad : {"\"a@" + std::string(64, 'x'), std::string("\"a@b.c.d.e.f")}) {
    auto m = matcher(Kind::kJsonSchema, email);
    ASSERT_TRUE(m);
    const size_t n = feed(*m, bad);
    const bool refused = n < tok_->encode(bad)->size();
    bool closes = false;
    if (!refused) {  // everything accepted so far: the string may not close here either
      std::vector<uint32_t> bits(mask_words(kVocab));
      m->fill_mask(bits);
      closes = mask_allows(bits, tok_->encode("\"")->front());
    }
    EXPECT_TRUE(refused || !closes) << bad;
  }
}

// Random walks through the mask (a stand-in for a sampler) always produce valid output.
TEST_F(GrammarTest, RandomWalksUnderTheMaskAreValid) {
  const std::string schema =
      R"({"type": "object", "properties": {"id": {"type": "integer", "minimum": -5, "maximum": 999},
          "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
          "ok": {"type": "boolean"}}, "required": ["id", "tags", "ok"]})";
  std::mt19937 rng(7);
  int completed = 0;
  for (int walk = 0; walk < 20; ++walk) {
    auto m = matcher(Kind::kJsonSchema, schema);
    ASSERT_TRUE(m);
    std::vector<uint32_t> bits(mask_words(kVocab));
    std::vector<int32_t> out;
    for (int step = 0; step < 200 && !m->terminated(); ++step) {
      bits.assign(bits.size(), 0u);
      ASSERT_TRUE(m->fill_mask(bits));
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < kVocab; ++t) {
        if (mask_allows(bits, t))
          allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty());
      // Prefer EOS once allowed half the time, else a random allowed token; digits would
      // otherwise go on for long.
      int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      if (mask_allows(bits, eos_) && (rng() & 1))
        t = eos_;
      ASSERT_TRUE(m->accept(t).ok());
      if (t != eos_)
        out.push_back(t);
    }
    if (!m->terminated())
      continue;
    ++completed;
    const std::string text = *tok_->decode(out);
    auto j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j["id"].is_number_integer()) << text;
    EXPECT_GE(j["id"].get<int64_t>(), -5) << text;
    EXPECT_LE(j["id"].get<int64_t>(), 999) << text;
    EXPECT_TRUE(j["ok"].is_boolean()) << text;
    ASSERT_TRUE(j["tags"].is_array()) << text;
    EXPECT_LE(j["tags"].size(), 3u) << text;
    for (const auto& e : j["tags"]) {
      EXPECT_TRUE(e == "a" || e == "b" || e == "c") << text;
    }
  }
  EXPECT_GT(completed, 0);
}

#else

TEST_F(GrammarTest, UnavailableWithoutXGrammar) {
  EXPECT_FALSE(available());
  auto g = compiler_->compile({Kind::kJsonObject, ""});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented);
}

#endif

}  // namespace
}  // namespace dsinfer::grammar
