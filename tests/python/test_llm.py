"""The dsinfer Python package on the bundled model (models/dsv4-mini): generate from token ids
and from text equals `dsinfer generate`; chat; seeds; logprobs; score; errors; Ctrl-C."""

import _thread
import threading
from pathlib import Path

import numpy as np
import pytest

import dsinfer
from dsinfer import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24)


def test_generate_token_ids_matches_cli(llm, cli, tmp_path):
    prompts = [[0, 17, 42, 99], [0, 5], list(range(1, 40))]
    reqs = [{"prompt_token_ids": p, "max_tokens": 24, "temperature": 0} for p in prompts]
    want = cli(reqs, tmp_path)
    got = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert len(got) == len(want)
    for g, w, p in zip(got, want, prompts):
        assert g.token_ids == w["output_token_ids"]
        assert g.text == w["text"]
        assert g.finish_reason == w["finish_reason"]
        assert g.prompt_token_ids == p
        assert g.prompt is None


def test_generate_text_matches_cli(llm, cli, tmp_path):
    prompts = ["def fib(n):", "import os\n\nclass Config:", "# sort a list\n"]
    params = [
        SamplingParams(temperature=0, max_tokens=32),
        SamplingParams(temperature=0, max_tokens=8),
        SamplingParams(temperature=0, max_tokens=40, stop=["\n\n"]),
    ]
    reqs = [{"prompt": p, **sp.to_request()} for p, sp in zip(prompts, params)]
    want = cli(reqs, tmp_path)
    got = llm.generate(prompts, params, use_tqdm=False)
    for g, w, p in zip(got, want, prompts):
        assert g.text == w["text"]
        assert g.token_ids == w["output_token_ids"]
        assert g.finish_reason == w["finish_reason"]
        assert g.outputs[0].stop_reason == w.get("stop_reason")
        assert g.prompt == p
        assert g.prompt_token_ids == llm.encode(p)
        assert len(g.prompt_token_ids) == w["prompt_tokens"]


def test_single_prompt_forms(llm):
    a = llm.generate("def add(a, b):", GREEDY, use_tqdm=False)
    ids = llm.encode("def add(a, b):")
    b = llm.generate(ids, GREEDY, use_tqdm=False)
    c = llm.generate({"prompt_token_ids": np.array(ids)}, GREEDY, use_tqdm=False)
    assert len(a) == len(b) == len(c) == 1
    assert a[0].token_ids == b[0].token_ids == c[0].token_ids
    assert a[0].outputs[0].text == a[0].text == llm.decode(a[0].token_ids)


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_matches_cli(llm, cli, tmp_path, thinking):
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    sp = SamplingParams(temperature=0, max_tokens=32)
    flag = "on" if thinking else "off"
    want = cli([{"messages": messages, **sp.to_request()}], tmp_path, "--thinking", flag)
    got = llm.chat(messages, sp, thinking=thinking, use_tqdm=False)
    assert len(got) == 1
    out = got[0].outputs[0]
    assert out.text == want[0]["text"]
    assert out.token_ids == want[0]["output_token_ids"]
    assert out.content == want[0]["content"]
    assert out.reasoning_content == want[0]["reasoning_content"]
    assert got[0].prompt_token_ids[0] == 0  # BOS from the DeepSeek prompt format


def test_chat_thinking_and_tools_render(llm):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    sp = SamplingParams(temperature=0, max_tokens=8)
    plain = llm.chat(messages, sp, use_tqdm=False)[0]
    think = llm.chat(messages, sp, thinking=True, use_tqdm=False)[0]
    tooled = llm.chat(messages, sp, tools=tools, use_tqdm=False)[0]
    assert think.prompt_token_ids != plain.prompt_token_ids
    assert len(tooled.prompt_token_ids) > len(plain.prompt_token_ids)
    assert "get_weather" in llm.decode(tooled.prompt_token_ids, skip_special=False)
    batch = llm.chat([messages, messages], sp, use_tqdm=False)
    assert [b.token_ids for b in batch] == [plain.token_ids] * 2


def test_same_seed_same_output(llm):
    prompt = "def main():"
    runs = [
        llm.generate(prompt, SamplingParams(temperature=1.0, seed=s, max_tokens=24), use_tqdm=False)[0]
        for s in (7, 7, 8, 9)
    ]
    assert runs[0].token_ids == runs[1].token_ids
    assert len({tuple(r.token_ids) for r in runs}) > 1  # other seeds sample differently
    # A request's samples do not depend on the batch around it.
    batch = llm.generate(
        ["x = 1", prompt, "for i in range(3):"],
        SamplingParams(temperature=1.0, seed=7, max_tokens=24),
        use_tqdm=False,
    )
    assert batch[1].token_ids == runs[0].token_ids


def test_logprobs(llm):
    ids = llm.encode("def square(x):")
    out = llm.generate(ids, SamplingParams(temperature=0, max_tokens=12, logprobs=3),
                       use_tqdm=False)[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
    # Greedy: the sampled token is the top alternative; its logprob matches the model's
    # log-softmax from score() over the same sequence.
    logits = llm.score(ids + out.token_ids[:-1]).astype(np.float64)
    lsm = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    total = 0.0
    for i, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        assert tok in lp and lp[tok].rank == 1
        assert 3 <= len(lp) <= 4
        ranks = sorted(v.rank for v in lp.values() if v.rank is not None)
        assert ranks == [1, 2, 3]
        assert lp[tok].logprob <= 0
        assert lp[tok].logprob == pytest.approx(lsm[len(ids) - 1 + i, tok], abs=2e-3)
        assert isinstance(lp[tok].decoded_token, str)
        total += lp[tok].logprob
    assert out.cumulative_logprob == pytest.approx(total)
    plain = llm.generate(ids, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    assert plain.logprobs is None and plain.token_ids == out.token_ids


def test_score(llm):
    ids = llm.encode("import numpy as np\n")
    logits = llm.score(ids)
    assert isinstance(logits, np.ndarray)
    assert logits.dtype == np.float32 and logits.shape == (len(ids), llm.vocab_size)
    assert np.isfinite(logits).all()
    first = llm.generate(ids, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    assert first.token_ids[0] == int(np.argmax(logits[-1]))
    assert np.array_equal(llm.score("import numpy as np\n"), logits)


def test_bad_sampling_values_raise_engine_message(llm):
    cases = [
        (SamplingParams(temperature=-1), "temperature must be in [0, 100], got -1"),
        (SamplingParams(top_p=0), "top_p must be in (0, 1], got 0"),
        (SamplingParams(repetition_penalty=0), "repetition_penalty must be in (0, 10]"),
        (SamplingParams(temperature="hot"), "field 'temperature' must be a number"),
        (SamplingParams(stop=[1]), "field 'stop' must be a string or a list of strings"),
        (SamplingParams(max_tokens=0), "max_tokens"),
    ]
    for sp, msg in cases:
        with pytest.raises(ValueError) as e:
            llm.generate("x", sp, use_tqdm=False)
        assert msg in str(e.value)


def test_bad_prompts_raise_engine_message(llm):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[0, 999999]], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate({"prompt_token_ids": []}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="request 1: "):
        llm.generate(["fine", {"prompt": 3}], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a", "b"], [GREEDY], use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len|context|exceeds"):
        llm.generate("x", SamplingParams(max_tokens=10**6), use_tqdm=False)
    with pytest.raises(ValueError):
        llm.chat([{"role": "nobody", "content": "hi"}], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="no token ids"):
        llm.score([])


def test_bad_engine_flags_raise_engine_message(model_dir):
    with pytest.raises(ValueError, match="--numerics must be `auto`, `reference` or `deepseek`"):
        LLM(model=model_dir, numerics="fp3")
    with pytest.raises(ValueError, match="--state-memory: cannot parse size"):
        LLM(model=model_dir, state_memory="lots")
    with pytest.raises(ValueError, match="--device: `tpu` is not one of"):
        LLM(model=model_dir, device="tpu")
    with pytest.raises(ValueError, match="--model-version must be"):
        LLM(model=model_dir, model_version="v9")
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLM(model=model_dir, max_num_seqs=0)
    with pytest.raises(ValueError, match="--cpu-kernels must be"):
        LLM(model=model_dir, cpu_kernels="turbo")
    with pytest.raises(FileNotFoundError):
        LLM(model="/nonexistent/model/dir")


def test_engine_flags(model_dir):
    small = LLM(model=model_dir, max_model_len=64, max_num_seqs=2, state_memory=64 << 20,
                numerics="deepseek")
    assert small.max_model_len == 64
    out = small.generate(["a", "b", "c"], SamplingParams(temperature=0, max_tokens=4),
                         use_tqdm=False)
    assert [len(o.token_ids) <= 4 for o in out] == [True] * 3
    with pytest.raises(ValueError):
        small.generate("x", SamplingParams(max_tokens=100), use_tqdm=False)
    # async_scheduling=False (CUDA's `--no-async-scheduling`; the CPU backend always waits): the
    # same greedy tokens.
    waiting = LLM(model=model_dir, max_model_len=64, max_num_seqs=2, state_memory=64 << 20,
                  numerics="deepseek", async_scheduling=False)
    again = waiting.generate(["a", "b", "c"], SamplingParams(temperature=0, max_tokens=4),
                             use_tqdm=False)
    assert [o.token_ids for o in again] == [o.token_ids for o in out]


def test_interrupt_leaves_engine_usable(llm):
    want = llm.generate("def fib(n):", GREEDY, use_tqdm=False)[0].token_ids
    long = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(["a = 1", "b = 2", "c = 3", "d = 4"], long, use_tqdm=False)
    finally:
        timer.cancel()
    assert llm.generate("def fib(n):", GREEDY, use_tqdm=False)[0].token_ids == want


def test_gil_released_while_generating(llm):
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.001)

    t = threading.Thread(target=spin)
    t.start()
    try:
        before = len(ticks)
        llm.generate(["a", "b"], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                     use_tqdm=False)
        during = len(ticks) - before
    finally:
        stop.set()
        t.join()
    assert during > 5  # the thread ran while the engine stepped


def test_progress_callback_exception_aborts(llm):
    calls = []

    class Boom(Exception):
        pass

    def progress(done, total, prompt_tokens, generated_tokens):
        calls.append((done, total))
        raise Boom()

    lines = ['{"prompt": "x = ", "max_tokens": 200, "ignore_eos": true}']
    with pytest.raises(Boom):
        llm._engine.generate(lines, progress)
    assert calls and calls[0][1] == 1
    assert len(llm.generate("y", GREEDY, use_tqdm=False)[0].token_ids) > 0


def test_tqdm_progress(llm, capsys):
    pytest.importorskip("tqdm")
    out = llm.generate(["a", "b"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=True)
    assert len(out) == 2
    assert "Processed prompts" in capsys.readouterr().err


def test_package_ships_type_stubs():
    pkg = Path(dsinfer.__file__).parent
    assert (pkg / "py.typed").exists()
    assert (pkg / "_core.pyi").exists()
    assert LLM.generate.__doc__ and SamplingParams.__doc__


CTRL_C_CHILD = r"""
import sys
from dsinfer import LLM, SamplingParams

llm = LLM(model=sys.argv[1])
greedy = SamplingParams(temperature=0, max_tokens=8)
want = llm.generate("def fib(n):", greedy, use_tqdm=False)[0].token_ids
print("generating", flush=True)
try:
    llm.generate(["a", "b"], SamplingParams(max_tokens=2000, ignore_eos=True), use_tqdm=False)
    print("finished without interruption", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
again = llm.generate("def fib(n):", greedy, use_tqdm=False)[0].token_ids
print("usable" if again == want else "different", flush=True)
"""


def test_sigint_in_a_real_process(model_dir):
    """A real SIGINT (Ctrl-C) to a process inside generate: KeyboardInterrupt, then the same LLM
    generates again with the same result."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    child = subprocess.Popen([sys.executable, "-c", CTRL_C_CHILD, model_dir], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "generating"
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    assert out.split() == ["interrupted", "usable"]


def test_cpu_kernels_same_greedy_tokens(llm, model_dir):
    """The fast CPU path (the default) and the reference give the same greedy tokens."""
    ref = LLM(model=model_dir, cpu_kernels="reference", cpu_threads=1)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    prompts = [[0, 5, 6, 7], [0, 100, 200, 300, 400]]
    fast_out = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    ref_out = [o.token_ids for o in ref.generate(prompts, params, use_tqdm=False)]
    assert fast_out == ref_out
    assert all(len(t) == 16 for t in fast_out)
