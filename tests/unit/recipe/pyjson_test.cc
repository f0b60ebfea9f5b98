#include "recipe/pyjson.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace dsinfer::recipe {
namespace {

using nlohmann::ordered_json;

std::string dumps(const char* text) {
  auto r = py_json_normalize(text);
  EXPECT_TRUE(r.ok()) << text;
  return r.ok() ? *r : "";
}

TEST(RecipePyJson, Scalars) {
  EXPECT_EQ(dumps("null"), "null");
  EXPECT_EQ(dumps("true"), "true");
  EXPECT_EQ(dumps("false"), "false");
  EXPECT_EQ(dumps("0"), "0");
  EXPECT_EQ(dumps("-0"), "0");
  EXPECT_EQ(dumps("-17"), "-17");
  EXPECT_EQ(dumps("18446744073709551615"), "18446744073709551615");
  EXPECT_EQ(dumps("-9223372036854775808"), "-9223372036854775808");
  EXPECT_EQ(dumps("\"abc\""), "\"abc\"");
}

TEST(RecipePyJson, FloatsLikePythonRepr) {
  EXPECT_EQ(py_float_repr(0.1), "0.1");
  EXPECT_EQ(py_float_repr(1e-7), "1e-07");
  EXPECT_EQ(py_float_repr(1e16), "1e+16");
  EXPECT_EQ(py_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(py_float_repr(1.0), "1.0");
  EXPECT_EQ(py_float_repr(-0.0), "-0.0");
  EXPECT_EQ(py_float_repr(0.0), "0.0");
  EXPECT_EQ(py_float_repr(0.0001), "0.0001");
  EXPECT_EQ(py_float_repr(0.00001), "1e-05");
  EXPECT_EQ(py_float_repr(123.456), "123.456");
  EXPECT_EQ(py_float_repr(1.5e300), "1.5e+300");
  EXPECT_EQ(py_float_repr(-2.5e-300), "-2.5e-300");
  EXPECT_EQ(py_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(py_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(py_float_repr(5e-324), "5e-324");
  EXPECT_EQ(py_float_repr(123456789012345680.0), "1.2345678901234568e+17");
  EXPECT_EQ(py_float_repr(1234567890123456.7), "1234567890123456.8");
  EXPECT_EQ(py_float_repr(std::numeric_limits<double>::infinity()), "Infinity");
  EXPECT_EQ(py_float_repr(-std::numeric_limits<double>::infinity()), "-Infinity");
  EXPECT_EQ(py_float_repr(std::numeric_limits<double>::quiet_NaN()), "NaN");
  // Through the JSON parser: "1.0" stays a float, "1e2" becomes 100.0 as in Python.
  EXPECT_EQ(dumps("[1.0, 1e2, 2.50, -0.0, 1E-7, 1e16]"), "[1.0, 100.0, 2.5, -0.0, 1e-07, 1e+16]");
  EXPECT_EQ(py_json_dumps(ordered_json(std::numeric_limits<double>::infinity())), "Infinity");
}

// The V4 encoding's float form (deepseek-recipe): positional from 1e-5, no zero padding of a
// negative exponent; the rest as Python.
TEST(RecipePyJson, FloatsInTheV4Form) {
  const FloatStyle v4 = FloatStyle::kV4;
  EXPECT_EQ(py_float_repr(1e-7, v4), "1e-7");
  EXPECT_EQ(py_float_repr(0.00001, v4), "0.00001");
  EXPECT_EQ(py_float_repr(1.5e-5, v4), "0.000015");
  EXPECT_EQ(py_float_repr(1e-6, v4), "1e-6");
  EXPECT_EQ(py_float_repr(-1.5e-7, v4), "-1.5e-7");
  EXPECT_EQ(py_float_repr(1.2345678e-6, v4), "1.2345678e-6");
  EXPECT_EQ(py_float_repr(1e-300, v4), "1e-300");
  EXPECT_EQ(py_float_repr(0.0001, v4), "0.0001");
  EXPECT_EQ(py_float_repr(1e16, v4), "1e+16");
  EXPECT_EQ(py_float_repr(1e15, v4), "1000000000000000.0");
  EXPECT_EQ(py_float_repr(2.5, v4), "2.5");
  EXPECT_EQ(py_json_dumps(ordered_json::parse("[1E-7, 3, -0.0]"), v4), "[1e-7, 3, -0.0]");
}

TEST(RecipePyJson, StringEscapes) {
  EXPECT_EQ(py_json_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(py_json_quote("\n\t\r\b\f"), "\"\\n\\t\\r\\b\\f\"");
  EXPECT_EQ(py_json_quote(std::string("\x00\x01\x1f\x7f", 4)), "\"\\u0000\\u0001\\u001f\x7f\"");
  EXPECT_EQ(py_json_quote("/"), "\"/\"");
  // ensure_ascii=False: non-ASCII raw.
  EXPECT_EQ(py_json_quote("日本 é 😀 ｜"), "\"日本 é 😀 ｜\"");
  EXPECT_EQ(dumps("\"\\u65e5\\u0041\\ud83d\\ude00\""), "\"日A😀\"");
}

TEST(RecipePyJson, ContainersKeepOrderAndSeparators) {
  EXPECT_EQ(dumps("{\"z\":1,\"a\":{\"y\":[1,2,{}],\"b\":[]},\"m\":\"x\"}"),
            "{\"z\": 1, \"a\": {\"y\": [1, 2, {}], \"b\": []}, \"m\": \"x\"}");
  EXPECT_EQ(dumps("  [ ]  "), "[]");
  EXPECT_EQ(dumps("{}"), "{}");
  EXPECT_EQ(dumps("{\"k\\n\":\"v\\u0007\"}"), "{\"k\\n\": \"v\\u0007\"}");
  ordered_json o = ordered_json::object();
  o["type"] = "object";
  o["properties"] = ordered_json::object();
  o["properties"]["location"] = {{"type", "string"}};
  o["required"] = ordered_json::array({"location"});
  o["n"] = 0.5;
  EXPECT_EQ(py_json_dumps(o),
            "{\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\"}}, "
            "\"required\": [\"location\"], \"n\": 0.5}");
}

TEST(RecipePyJson, Invalid) {
  EXPECT_FALSE(py_json_normalize("{").ok());
  EXPECT_FALSE(py_json_normalize("").ok());
  EXPECT_FALSE(py_json_normalize("[1] x").ok());
  EXPECT_FALSE(py_json_normalize(std::string("1\0", 2)).ok());
  EXPECT_FALSE(py_json_normalize("NaN").ok());
}

}  // namespace
}  // namespace dsinfer::recipe
