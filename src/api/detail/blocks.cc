#include "api/detail/blocks.h"

#include "api/detail/common.h"

namespace dsinfer::api::detail {

using recipe::OutputEvent;

void BlockTracker::close(std::vector<BlockOp>* ops) {
  if (open_ < 0)
    return;
  blocks_[open_].open = false;
  ops->push_back(BlockOp{BlockOp::Type::kClose, static_cast<size_t>(open_), {}});
  open_ = -1;
}

void BlockTracker::open(Block b, std::vector<BlockOp>* ops) {
  close(ops);
  b.open = true;
  blocks_.push_back(std::move(b));
  open_ = static_cast<int>(blocks_.size()) - 1;
  ops->push_back(BlockOp{BlockOp::Type::kOpen, static_cast<size_t>(open_), {}});
}

std::vector<BlockOp> BlockTracker::apply(const OutputEvent& ev) {
  std::vector<BlockOp> ops;
  if (finished_)
    return ops;
  switch (ev.type) {
    case OutputEvent::Type::kReasoningDelta:
    case OutputEvent::Type::kContentDelta: {
      if (ev.text.empty())
        break;
      Block::Kind kind = ev.type == OutputEvent::Type::kReasoningDelta ? Block::Kind::kReasoning
                                                                       : Block::Kind::kText;
      if (open_ < 0 || blocks_[open_].kind != kind) {
        Block b;
        b.kind = kind;
        open(std::move(b), &ops);
      }
      blocks_[open_].text += ev.text;
      ops.push_back(BlockOp{BlockOp::Type::kDelta, static_cast<size_t>(open_), ev.text});
      break;
    }
    case OutputEvent::Type::kToolCallStart: {
      Block b;
      b.kind = Block::Kind::kTool;
      b.tool_ordinal = tool_count_;
      b.tool_id = make_tool_id_(tool_count_);
      b.tool_name = ev.tool_name;
      ++tool_count_;
      open(std::move(b), &ops);
      tool_block_[ev.tool_index] = static_cast<size_t>(open_);
      break;
    }
    case OutputEvent::Type::kToolCallArgumentsDelta: {
      auto it = tool_block_.find(ev.tool_index);
      if (it == tool_block_.end() || static_cast<int>(it->second) != open_ || ev.text.empty()) {
        break;
      }
      blocks_[open_].text += ev.text;
      ops.push_back(BlockOp{BlockOp::Type::kDelta, static_cast<size_t>(open_), ev.text});
      break;
    }
    case OutputEvent::Type::kToolCallEnd: {
      auto it = tool_block_.find(ev.tool_index);
      if (it != tool_block_.end() && static_cast<int>(it->second) == open_)
        close(&ops);
      break;
    }
    case OutputEvent::Type::kFinish:
      close(&ops);
      finished_ = true;
      finish_ = ev.finish;
      stop_sequence_ = ev.stop_sequence;
      break;
  }
  return ops;
}

std::vector<BlockOp> BlockTracker::close_open() {
  std::vector<BlockOp> ops;
  close(&ops);
  return ops;
}

recipe::FinishReason BlockTracker::finish_reason() const {
  return effective_finish(finish_, tool_count_ > 0);
}

}  // namespace dsinfer::api::detail
