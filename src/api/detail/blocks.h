// Internal: groups a stream of OutputEvents into output blocks (a run of reasoning, a run of
// answer text, one tool call each), the shape that Messages content blocks and Responses output
// items share; Chat uses it for its deltas and aggregate message.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "recipe/types.h"

namespace dsinfer::api::detail {

struct Block {
  enum class Kind { kReasoning, kText, kTool };
  Kind kind = Kind::kText;
  std::string text;  // reasoning / text; kTool: the arguments JSON text
  std::string tool_id;
  std::string tool_name;
  int tool_ordinal = -1;  // 0-based among tool blocks
  bool open = true;
};

struct BlockOp {
  enum class Type { kOpen, kDelta, kClose };
  Type type = Type::kOpen;
  size_t block = 0;
  std::string text;  // kDelta
};

class BlockTracker {
 public:
  // make_tool_id(ordinal) names each tool call.
  explicit BlockTracker(std::function<std::string(int)> make_tool_id)
      : make_tool_id_(std::move(make_tool_id)) {}

  // Events after kFinish are ignored; so are argument deltas / ends for a tool call that is not
  // the open block.
  std::vector<BlockOp> apply(const recipe::OutputEvent& ev);
  // Closes the open block (used at finish).
  std::vector<BlockOp> close_open();

  const std::vector<Block>& blocks() const { return blocks_; }
  bool finished() const { return finished_; }
  bool has_tool_calls() const { return tool_count_ > 0; }
  int tool_count() const { return tool_count_; }
  // The finish reason as reported (kStop if no kFinish came), with tool calls applied.
  recipe::FinishReason finish_reason() const;
  const std::string& stop_sequence() const { return stop_sequence_; }

 private:
  void close(std::vector<BlockOp>* ops);
  void open(Block b, std::vector<BlockOp>* ops);

  std::function<std::string(int)> make_tool_id_;
  std::vector<Block> blocks_;
  int open_ = -1;                         // index of the open block
  std::map<int32_t, size_t> tool_block_;  // parser tool_index -> block
  int tool_count_ = 0;
  bool finished_ = false;
  recipe::FinishReason finish_ = recipe::FinishReason::kStop;
  std::string stop_sequence_;
};

}  // namespace dsinfer::api::detail
