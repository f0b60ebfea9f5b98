"""LLM: offline batch inference over one dsinfer engine (vLLM-like)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _core
from .outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput, ToolCall
from .sampling_params import SamplingParams, _plain

# A prompt: text, token ids, or a dict {"prompt": text} / {"prompt_token_ids": ids}.
PromptType = Union[str, List[int], Dict[str, Any]]
Message = Dict[str, Any]


def _is_token_ids(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(
        not isinstance(t, (list, tuple, dict, str)) for t in x
    )


class LLM:
    """A DeepSeek V4 or V4.1 model loaded into a dsinfer engine.

    Args:
        model: model directory (config.json, safetensors, tokenizer.json). Default:
            $DSINFER_MODEL, else ./models/dsv4-mini. A V4.1 checkpoint (model_type
            deepseek_v41) runs on the V4.1 backends (CPU; CUDA written, not yet run on a GPU);
            its Engram token map (engram_token_map.json) must be beside it.
        device: "cpu", "cuda" or "cuda:N" (CUDA needs a package built with CUDA, see
            docs/python.md).
        numerics: "auto" ("deepseek" on CUDA, "reference" on the CPU), "reference" (fp32, no
            activation quantisation) or "deepseek" (DeepSeek's FP8/FP4 quantisation points,
            the path the CUDA kernels are built for).
        state_memory: the sequence-state memory budget: bytes, or a size such as "1GiB".
        max_num_seqs: sequences running at once.
        max_tokens_per_step: token budget of one engine step (chunked prefill).
        max_model_len: context limit, prompt + output tokens (None or 0: the model's).
        model_version: prompt format of chat(): "auto" (V4.1's for a V4.1 checkpoint, else
            "v4"), "v4", "v4-0731" or "v4.1". The resolved value is `LLM.model_version`.
        cuda_graphs: replay decode steps from CUDA graphs (CUDA only).
        async_scheduling: launch each decode step before the previous one's tokens are back
            (CUDA only; steps with penalties, structured outputs or speculation wait).
        cpu_kernels: device "cpu": "fast" (batched vectorised GEMMs on a thread pool) or
            "reference" (the plain reference implementation; same greedy tokens).
        cpu_threads: threads of the fast CPU path (0: $DSINFER_CPU_THREADS or all).

    These are the engine flags of `dsinfer generate` / `dsinfer serve`. Bad values raise
    ValueError with the engine's message; a missing model directory FileNotFoundError.
    One LLM runs one call at a time (calls from several threads wait for each other).
    """

    def __init__(
        self,
        model: Optional[str] = None,
        device: str = "cpu",
        *,
        numerics: str = "auto",
        state_memory: Union[str, int] = "1GiB",
        max_num_seqs: int = 64,
        max_tokens_per_step: int = 256,
        max_model_len: Optional[int] = None,
        model_version: str = "auto",
        cuda_graphs: bool = True,
        async_scheduling: bool = True,
        cpu_kernels: str = "fast",
        cpu_threads: int = 0,
    ) -> None:
        if isinstance(state_memory, bool) or not isinstance(state_memory, (str, int)):
            raise ValueError("state_memory must be a size such as '1GiB' or a number of bytes")
        self._engine = _core.Engine(
            model=str(model) if model is not None else "",
            device=device,
            numerics=numerics,
            state_memory=str(state_memory),
            max_num_seqs=max_num_seqs,
            max_tokens_per_step=max_tokens_per_step,
            max_model_len=max_model_len or 0,
            model_version=model_version,
            cuda_graphs=cuda_graphs,
            async_scheduling=async_scheduling,
            cpu_kernels=cpu_kernels,
            cpu_threads=cpu_threads,
        )
        self.model: str = self._engine.model_dir
        self.device: str = device
        self.model_version: str = self._engine.model_version

    # -- generation ---------------------------------------------------------------------------

    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        *,
        use_tqdm: bool = True,
    ) -> List[RequestOutput]:
        """Generates completions for a batch of prompts; returns one RequestOutput per prompt,
        in order.

        Args:
            prompts: a prompt or a list of them. A prompt is text (tokenized as is, no chat
                template; no BOS added for V4, BOS prepended for V4.1 as its tokenizer policy
                does), a list of token ids, or a dict {"prompt": text} or
                {"prompt_token_ids": ids}. A list of ints is one token-id prompt.
            sampling_params: one SamplingParams for every prompt, or one per prompt (None:
                the defaults).
            use_tqdm: show a progress bar when tqdm is installed.

        Raises:
            ValueError: a bad prompt or sampling value (the engine's message, prefixed by
                "request i: " in a batch), e.g. V4.1's image placeholder ids (image inputs are
                not supported yet); nothing runs then.
            KeyboardInterrupt: Ctrl-C; the call's requests are aborted and the LLM stays usable.
        """
        if isinstance(prompts, (str, dict)) or _is_token_ids(prompts):
            batch: List[PromptType] = [prompts]  # type: ignore[list-item]
        else:
            batch = list(prompts)  # type: ignore[arg-type]
        requests: List[Dict[str, Any]] = []
        for p in batch:
            if isinstance(p, str):
                requests.append({"prompt": p})
            elif isinstance(p, dict):
                requests.append({k: _plain(v) for k, v in p.items()})
            else:
                requests.append({"prompt_token_ids": _plain(p)})
        return self._run(requests, sampling_params, use_tqdm)

    def chat(
        self,
        messages: Union[List[Message], Sequence[List[Message]]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        *,
        thinking: bool = False,
        tools: Optional[List[Dict[str, Any]]] = None,
        use_tqdm: bool = True,
    ) -> List[RequestOutput]:
        """Chat completions through the DeepSeek prompt format of `model_version` (the prompt
        `dsinfer generate --messages` renders); returns one RequestOutput per conversation.

        Args:
            messages: one conversation (a list of {"role", "content", ...} dicts in the OpenAI
                Chat Completions shape) or a list of conversations.
            sampling_params: as in generate().
            thinking: thinking mode (the model reasons first; see reasoning_content).
            tools: OpenAI-style tool definitions ([{"type": "function", "function": {...}}]).
                V4.1 models: image content parts raise ValueError (no vision tower yet).
            use_tqdm: show a progress bar when tqdm is installed.

        The outputs carry `reasoning_content`, `content` and `tool_calls` parsed by the recipe.
        """
        if messages and isinstance(messages[0], dict):
            conversations: List[List[Message]] = [messages]  # type: ignore[list-item]
        else:
            conversations = list(messages)  # type: ignore[arg-type]
        requests: List[Dict[str, Any]] = []
        for conv in conversations:
            r: Dict[str, Any] = {"messages": conv, "thinking": bool(thinking)}
            if tools is not None:
                r["tools"] = tools
            requests.append(r)
        return self._run(requests, sampling_params, use_tqdm)

    # -- scoring and tokenizer ----------------------------------------------------------------

    def score(self, token_ids: Union[str, Sequence[int]]) -> "Any":
        """Logits at every position of one sequence: a float32 numpy array [T, vocab_size],
        row i predicting token i+1 (what `dsinfer score` writes). Text is tokenized first.

        Log-probabilities of the sequence's own tokens, for evaluation:
            logits = llm.score(ids)
            lp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
            token_lp = lp[np.arange(len(ids) - 1), ids[1:]]
        """
        ids = self.encode(token_ids) if isinstance(token_ids, str) else _plain(list(token_ids))
        return self._engine.score(ids)

    def encode(self, text: str, allow_special: bool = False) -> List[int]:
        """Text -> token ids with the model's tokenizer (no BOS added)."""
        return self._engine.encode(text, allow_special)

    def decode(self, token_ids: Sequence[int], skip_special: bool = True) -> str:
        """Token ids -> text with the model's tokenizer."""
        return self._engine.decode(_plain(list(token_ids)), skip_special)

    @property
    def vocab_size(self) -> int:
        return self._engine.vocab_size

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    # -- internals ----------------------------------------------------------------------------

    def _run(
        self,
        requests: List[Dict[str, Any]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]],
        use_tqdm: bool,
    ) -> List[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(requests)
        else:
            params = list(sampling_params)
            if len(params) != len(requests):
                raise ValueError(
                    f"got {len(params)} sampling_params for {len(requests)} prompts "
                    "(give one, or one per prompt)"
                )
        lines = []
        for r, sp in zip(requests, params):
            if not isinstance(sp, SamplingParams):
                raise ValueError("sampling_params must be SamplingParams objects")
            line = dict(sp.to_request())
            line.update(r)
            try:
                lines.append(json.dumps(line))
            except (TypeError, ValueError) as e:
                raise ValueError(f"request is not representable as JSON: {e}") from None
        if not lines:
            return []
        bar = _progress_bar(len(lines)) if use_tqdm else None
        try:
            results = self._engine.generate(lines, bar.update if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()
        return [self._output(json.loads(r), req) for r, req in zip(results, requests)]

    def _output(self, r: Dict[str, Any], request: Dict[str, Any]) -> RequestOutput:
        logprobs = None
        cumulative = None
        if "logprobs" in r:
            decode = self._engine.decode if self._engine.has_tokenizer else None
            logprobs = []
            cumulative = 0.0
            for entry in r["logprobs"]:
                d: Dict[int, Logprob] = {}
                top = entry["top"]
                ranks = {tok: i + 1 for i, (tok, _) in enumerate(top)}
                chosen = entry["token"]
                d[chosen] = Logprob(
                    entry["logprob"], ranks.get(chosen), decode([chosen], False) if decode else None
                )
                for tok, lp in top:
                    if tok not in d:
                        d[tok] = Logprob(lp, ranks[tok], decode([tok], False) if decode else None)
                cumulative += entry["logprob"]
                logprobs.append(d)
        tool_calls = None
        if "tool_calls" in r:
            tool_calls = [ToolCall(c["name"], c["arguments"]) for c in r["tool_calls"]]
        completion = CompletionOutput(
            index=0,
            text=r["text"],
            token_ids=r["output_token_ids"],
            finish_reason=r["finish_reason"],
            stop_reason=r.get("stop_reason"),
            logprobs=logprobs,
            cumulative_logprob=cumulative,
            reasoning_content=r.get("reasoning_content"),
            content=r.get("content"),
            tool_calls=tool_calls,
            error=r.get("error"),
        )
        return RequestOutput(
            request_id=str(r["index"]),
            prompt=request.get("prompt"),
            prompt_token_ids=r["prompt_token_ids"],
            outputs=[completion],
            metrics=RequestMetrics(r["ttft_s"], r["latency_s"]),
        )


class _Bar:
    """A tqdm bar over finished requests, with the generation throughput as postfix."""

    def __init__(self, tqdm: Any, total: int) -> None:
        self._bar = tqdm(total=total, desc="Processed prompts", unit="req", dynamic_ncols=True)
        self._done = 0

    def update(self, done: int, total: int, prompt_tokens: int, generated_tokens: int) -> None:
        elapsed = self._bar.format_dict.get("elapsed") or 0.0
        if elapsed > 0:
            self._bar.set_postfix_str(
                f"input: {prompt_tokens / elapsed:.1f} tok/s, "
                f"output: {generated_tokens / elapsed:.1f} tok/s",
                refresh=False,
            )
        if done > self._done:
            self._bar.update(done - self._done)
            self._done = done
        else:
            self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


def _progress_bar(total: int) -> Optional[_Bar]:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return _Bar(tqdm, total)
