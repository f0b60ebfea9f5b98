"""dsinfer.LLM on a DeepSeek V4.1 checkpoint: a tiny random V4.1 written by `dsinfer
make-checkpoint --preset v4.1-tiny --tokenizer` (the bundled model's V4 tokenizer, V4.1's policy
ids). The model version is detected from the checkpoint; generate (token ids, and text with
V4.1's BOS) and chat (V4.1 rendering, thinking on and off) equal `dsinfer generate` on the same
model; score agrees with greedy generation; image placeholder ids and image content are refused
with ValueError."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dsinfer import LLM, SamplingParams

from conftest import MODEL, _find_cli

GREEDY = SamplingParams(temperature=0, max_tokens=6)


@pytest.fixture(scope="module")
def v41_dir(tmp_path_factory):
    exe = _find_cli()
    if exe is None:
        pytest.skip("no dsinfer binary (set DSINFER_CLI or build build/bin/dsinfer)")
    tok = Path(MODEL) / "tokenizer.json"
    if not tok.exists():
        pytest.skip(f"no tokenizer.json in {MODEL}")
    out = tmp_path_factory.mktemp("v41") / "model"
    subprocess.run([exe, "make-checkpoint", "--preset", "v4.1-tiny", "--tokenizer", str(tok),
                    "--seed", "5", "--out", str(out)], check=True, capture_output=True)
    return str(out)


@pytest.fixture(scope="module")
def v41(v41_dir):
    return LLM(model=v41_dir, state_memory="64MiB")


def run_cli(model, requests, tmp_path):
    inp = tmp_path / "in.jsonl"
    out = tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in requests))
    subprocess.run([_find_cli(), "generate", "--model", model, "--input", str(inp), "--output",
                    str(out), "--no-progress"], check=True, capture_output=True)
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_model_version_is_detected(v41, v41_dir):
    assert v41.model_version == "v4.1"
    assert v41.vocab_size == 8192 or v41.vocab_size == json.loads(
        (Path(v41_dir) / "config.json").read_text())["text_config"]["vocab_size"]
    assert v41.max_model_len > 0
    # The V4 model stays V4 under "auto".
    assert LLM(model=MODEL, state_memory="64MiB").model_version == "v4"


def test_generate_matches_cli(v41, v41_dir, tmp_path):
    prompts = [[0, 17, 42, 99], "def fib(n):"]
    want = run_cli(v41_dir, [{"prompt_token_ids": prompts[0], "max_tokens": 6, "temperature": 0},
                             {"prompt": prompts[1], "max_tokens": 6, "temperature": 0}], tmp_path)
    got = v41.generate(prompts, GREEDY, use_tqdm=False)
    for g, w in zip(got, want):
        assert g.token_ids == w["output_token_ids"]
        assert g.text == w["text"]
        assert g.finish_reason == w["finish_reason"]
    # V4.1's tokenizer policy: a text prompt gets BOS (id 0).
    assert got[1].prompt_token_ids == [0] + v41.encode(prompts[1])
    assert got[0].prompt_token_ids == prompts[0]


def test_chat_renders_v41(v41, v41_dir, tmp_path):
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    system_id = v41.encode("<｜System｜>", allow_special=True)
    assert len(system_id) == 1
    for thinking in (False, True):
        want = run_cli(v41_dir, [{"messages": conv, "thinking": thinking, "max_tokens": 6,
                                  "temperature": 0}], tmp_path)[0]
        out = v41.chat(conv, GREEDY, thinking=thinking, use_tqdm=False)[0]
        assert out.token_ids == want["output_token_ids"]
        assert len(out.prompt_token_ids) == want["prompt_tokens"]
        # V4.1's prompt: BOS, then <｜System｜> (V4 has no system-turn token).
        assert out.prompt_token_ids[:2] == [0, system_id[0]]
        text = v41.decode(out.prompt_token_ids, skip_special=False)
        assert text.endswith("<think>") == thinking
        assert ("Reasoning Effort: " in text) == thinking
        assert out.outputs[0].reasoning_content is not None or not thinking


def test_score_agrees_with_greedy(v41):
    ids = [0, 5, 300, 17, 42]
    logits = v41.score(ids)
    assert logits.shape == (len(ids), v41.vocab_size)
    assert logits.dtype == np.float32
    first = v41.generate(ids, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    assert first.token_ids[0] == int(np.argmax(logits[-1]))


def test_image_placeholders_and_content_are_refused(v41):
    vocab = v41.vocab_size
    for bad in (vocab + 1, 129264):
        with pytest.raises(ValueError, match="placeholder|vision|image"):
            v41.generate([0, 5, bad], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="image"):
        v41.score([0, vocab + 3])
    with pytest.raises(ValueError, match="V4.1"):
        v41.chat([{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}],
            GREEDY, use_tqdm=False)
    # Still usable after the refusals.
    assert len(v41.generate([0, 5], GREEDY, use_tqdm=False)[0].token_ids) > 0
