"""dsinfer: offline inference for the DeepSeek V4 family from Python.

    from dsinfer import LLM, SamplingParams

    llm = LLM(model="models/dsv4-mini")
    out = llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=32))
    print(out[0].text)

See docs/python.md for the API.
"""

from .llm import LLM
from .outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput, ToolCall
from .sampling_params import SamplingParams

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "SamplingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "RequestMetrics",
    "ToolCall",
    "__version__",
]
