"""What LLM.generate and LLM.chat return (shaped like vLLM's RequestOutput)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Logprob:
    """Log-probability of one token at one position.

    Attributes:
        logprob: natural-log probability under the model's distribution (before sampling
            transforms such as temperature).
        rank: 1-based rank among the reported top alternatives; None when the token is not
            among them.
        decoded_token: the token's text, when the model has a tokenizer.
    """

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


@dataclass
class ToolCall:
    """A tool call parsed from a chat completion (arguments: JSON text)."""

    name: str
    arguments: str


@dataclass
class CompletionOutput:
    """One generated completion.

    Attributes:
        index: position in the request's outputs (always 0: one completion per request).
        text: the generated text (special tokens skipped; cut before a matched stop string).
        token_ids: the generated token ids (EOS / stop token included when it ended the output).
        finish_reason: "stop" (EOS, stop token or stop string), "length" (max_tokens or the
            context limit), "abort" or "error".
        stop_reason: the stop string that matched, if any.
        logprobs: with SamplingParams.logprobs, one dict per generated token mapping token id
            to Logprob: the sampled token and the top alternatives.
        cumulative_logprob: sum of the sampled tokens' logprobs (with logprobs), else None.
        reasoning_content, content, tool_calls: chat requests only, the output parsed by the
            DeepSeek recipe (thinking text, answer text, tool calls).
        error: the engine's message for a request that failed while running.
    """

    index: int
    text: str
    token_ids: List[int]
    finish_reason: Optional[str]
    stop_reason: Optional[str] = None
    logprobs: Optional[List[Dict[int, Logprob]]] = None
    cumulative_logprob: Optional[float] = None
    reasoning_content: Optional[str] = None
    content: Optional[str] = None
    tool_calls: Optional[List[ToolCall]] = None
    error: Optional[str] = None


@dataclass
class RequestMetrics:
    """Timings of one request, seconds on the engine's clock (ttft_s: -1 without a token)."""

    ttft_s: float
    latency_s: float


@dataclass
class RequestOutput:
    """The result of one request of LLM.generate / LLM.chat.

    Attributes:
        request_id: the request's index in the call, as a string.
        prompt: the prompt text (None for token-id prompts and chat requests).
        prompt_token_ids: the token ids the model saw (chat: the rendered conversation).
        outputs: the completion (one).
        finished: always True (generate returns when every request has finished).
        metrics: time to first token and latency.

    The completion's text, token_ids, finish_reason and logprobs are also attributes of the
    RequestOutput itself (shortcuts to outputs[0]).
    """

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool = True
    metrics: Optional[RequestMetrics] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> List[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> Optional[str]:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> Optional[List[Dict[int, Logprob]]]:
        return self.outputs[0].logprobs
