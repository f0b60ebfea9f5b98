"""Type stubs of the extension module dsinfer._core (the C++ engine; use dsinfer.LLM)."""

from typing import Callable, List, Optional

import numpy
import numpy.typing

class Engine:
    """One engine over a model directory (see dsinfer.LLM)."""

    def __init__(
        self,
        model: str,
        device: str,
        numerics: str,
        state_memory: str,
        max_num_seqs: int,
        max_tokens_per_step: int,
        max_model_len: int,
        model_version: str,
        cuda_graphs: bool,
        async_scheduling: bool,
        cpu_kernels: str,
        cpu_threads: int,
    ) -> None: ...
    def generate(
        self,
        requests: List[str],
        progress: Optional[Callable[[int, int, int, int], object]],
    ) -> List[str]:
        """Runs JSON request objects to completion; returns JSON result objects, in order."""
    def score(self, token_ids: List[int]) -> numpy.typing.NDArray[numpy.float32]:
        """Logits [T, vocab] at every position."""
    def encode(self, text: str, allow_special: bool = False) -> List[int]:
        """Text -> token ids (no BOS added)."""
    def decode(self, token_ids: List[int], skip_special: bool = True) -> str:
        """Token ids -> text."""
    @property
    def has_tokenizer(self) -> bool: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def model_dir(self) -> str: ...
    @property
    def model_version(self) -> str:
        """The prompt format chat() renders: "v4", "v4-0731" or "v4.1"."""
    @property
    def backend_name(self) -> str: ...
