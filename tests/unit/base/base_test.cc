// Status/Result propagation and string helpers.
#include <gtest/gtest.h>

#include "base/status.h"
#include "base/strings.h"

namespace dsinfer {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0)
    return invalid_argument(str_format("value %d is not positive", v));
  return v;
}

Status twice(int v, int* out) {
  DSI_ASSIGN_OR_RETURN(int x, parse_positive(v));
  *out = 2 * x;
  return Status();
}

TEST(Status, PropagatesErrorsAndValues) {
  int out = 0;
  EXPECT_TRUE(twice(4, &out).ok());
  EXPECT_EQ(out, 8);
  Status s = twice(-1, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "value -1 is not positive");
  EXPECT_EQ(s.with_context("flag --x").message(), "flag --x: value -1 is not positive");
  EXPECT_EQ(s.to_string(), "invalid argument: value -1 is not positive");
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  Result<int> r = invalid_argument("bad");
  EXPECT_DEATH((void)r.value(), "Result::value\\(\\) on error");
}

TEST(Strings, SplitFormatBytes) {
  EXPECT_EQ(str_split("a,,b", ','), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(str_format("%s-%03d", "x", 7), "x-007");
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(3 * 1024 * 1024), "3.00 MiB");
  EXPECT_TRUE(str_starts_with("layers.0", "layers."));
  EXPECT_TRUE(str_ends_with("w.scale", ".scale"));
}

}  // namespace
}  // namespace dsinfer
