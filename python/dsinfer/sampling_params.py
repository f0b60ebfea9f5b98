"""Sampling parameters of one request: the fields of the JSONL requests of `dsinfer generate`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union


def _plain(value: Any) -> Any:
    """Integers of any kind (numpy's too) as Python ints, lists element-wise; the rest as is.

    Values of the wrong type pass through unchanged, so that the engine rejects them with the
    message the CLI gives for the same JSONL field."""
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()  # numpy arrays and scalars
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "__index__") and not isinstance(value, int):
        return value.__index__()
    return value


@dataclass
class SamplingParams:
    """How one request samples and when it stops (defaults: those of `dsinfer generate`).

    Attributes:
        max_tokens: tokens to generate (>= 1; prompt + max_tokens must fit max_model_len).
        temperature: 0 is greedy; > 0 samples.
        top_p: nucleus sampling mass, in (0, 1].
        top_k: keep the k most likely tokens; 0 (or -1) is off.
        min_p: drop tokens below min_p * p_max, in [0, 1].
        seed: the request's sampling seed (None: 0). The same seed gives the same output,
            whatever else runs in the batch.
        stop: stop string(s); the text is cut before the first match (`stop_reason` names it).
        stop_token_ids: token ids that end the output besides EOS (the id is kept in token_ids).
        ignore_eos: keep generating after EOS.
        presence_penalty, frequency_penalty: in [-2, 2], on generated tokens.
        repetition_penalty: > 0 (1 = off), on prompt and generated tokens.
        logprobs: report the log-probability of every generated token and this many top
            alternatives (1..20); None or 0: none.
    """

    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = field(default=None)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: Optional[int] = None

    def to_request(self) -> Dict[str, Any]:
        """The sampling fields of a JSONL request object (None fields left out)."""
        out: Dict[str, Any] = {}
        for name in (
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stop",
            "stop_token_ids",
            "ignore_eos",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "logprobs",
        ):
            value = getattr(self, name)
            if value is None:
                continue
            if name == "top_k" and isinstance(value, int) and value == -1:
                value = 0  # vLLM's spelling of "off"
            out[name] = _plain(value)
        return out
