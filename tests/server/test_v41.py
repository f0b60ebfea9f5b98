"""DeepSeek V4.1 through `dsinfer serve` and the official `openai` and `anthropic` SDKs.

The served model is a tiny random V4.1 written by our own tooling (`dsinfer make-checkpoint
--preset v4.1-tiny --tokenizer T`: the V4 tokenizer of the served test model, checked against
V4.1's policy BOS 0 / EOS 1 / PAD 2, copied beside the checkpoint), so the server picks V4.1
prompt rendering from the checkpoint (`--model-version auto`). Checked: Chat Completions
streamed and not, Responses, Anthropic Messages (scripted output for thinking and tool calls,
model output otherwise); the prompt each request renders to is V4.1's (`<｜System｜>`, numeric
effort) for thinking on and off, token for token what `dsinfer recipe render --model-version
v4.1` gives; image content is a 400 in each protocol's error shape; parallel tool calls can be
switched off; /metrics reports the V4.1 state footprint.
"""

import json
import os
import shutil
import subprocess
import tempfile

import harness
from harness import MODEL_NAME

harness.require()

import anthropic  # noqa: E402
import openai  # noqa: E402

GREETING = "Hello! How can I help?"
NO_THINKING = {"thinking": {"type": "disabled"}}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
IMAGE_URL = "data:image/png;base64,iVBORw0KGgo="


def v4_tokenizer():
    """A tokenizer.json with V4.1's policy ids and `<｜System｜>` (the bundled model's)."""
    for d in (harness.model_dir(), os.path.join(harness.ROOT, "models", "dsv4-mini")):
        p = os.path.join(d, "tokenizer.json")
        if not os.path.exists(p):
            continue
        with open(p, encoding="utf-8") as f:
            tok = json.load(f)
        added = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
        if (added.get("<｜begin▁of▁sentence｜>") == 0 and added.get("<｜end▁of▁sentence｜>") == 1
                and added.get("<｜▁pad▁｜>") == 2 and "<｜System｜>" in added):
            return p
    harness.skip("no V4 tokenizer.json with V4.1's policy ids (models/dsv4-mini)")


class V41(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dsinfer-v41-")
        cls.model = os.path.join(cls.tmp, "model")
        cls.tokenizer = v4_tokenizer()
        r = subprocess.run([harness.dsinfer_bin(), "make-checkpoint", "--preset", "v4.1-tiny",
                            "--tokenizer", cls.tokenizer, "--seed", "3", "--out", cls.model],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        cls.server = harness.Server(model=cls.model)
        cls.oa = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="unused",
                               max_retries=0, timeout=60)
        cls.an = anthropic.Anthropic(base_url=cls.server.url, api_key="unused", max_retries=0,
                                     timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def render(self, protocol, body, version="v4.1"):
        """The token ids `dsinfer recipe render` gives for a request body."""
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(body, f)
        try:
            r = subprocess.run([harness.dsinfer_bin(), "recipe", "render", "--protocol", protocol,
                                "--request", f.name, "--model-version", version, "--tokenizer",
                                self.tokenizer], capture_output=True, text=True)
        finally:
            os.unlink(f.name)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    # ---- prompt rendering: V4.1's, picked from the checkpoint ----

    def test_thinking_on_and_off_render_as_v41(self):
        for thinking in (True, False):
            with self.subTest(thinking=thinking):
                body = {"model": MODEL_NAME, "max_tokens": 4,
                        "messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "[[answer]]"}],
                        "thinking": {"type": "enabled" if thinking else "disabled"}}
                want = self.render("chat", body)
                self.assertIn("<｜System｜>", want["prompt"])
                self.assertEqual(want["prompt"].endswith("<think>"), thinking)
                self.assertEqual(want["prompt"].endswith("</think>"), not thinking)
                if thinking:
                    self.assertIn("Reasoning Effort: ", want["prompt"])
                v4 = self.render("chat", body, version="v4-0731")
                self.assertNotEqual(want["token_ids"], v4["token_ids"])
                r = self.oa.chat.completions.create(
                    model=MODEL_NAME, messages=body["messages"], max_tokens=4,
                    extra_body={"thinking": body["thinking"]})
                self.assertEqual(r.usage.prompt_tokens, len(want["token_ids"]))
                m = self.an.messages.create(
                    model=MODEL_NAME, max_tokens=4, system="Be brief.",
                    messages=[{"role": "user", "content": "[[answer]]"}],
                    thinking=({"type": "enabled", "budget_tokens": 1024} if thinking
                              else {"type": "disabled"}))
                an_body = {"model": MODEL_NAME, "max_tokens": 4, "system": "Be brief.",
                           "messages": [{"role": "user", "content": "[[answer]]"}],
                           "thinking": ({"type": "enabled", "budget_tokens": 1024} if thinking
                                        else {"type": "disabled"})}
                self.assertEqual(m.usage.input_tokens, len(self.render("messages", an_body)
                                                           ["token_ids"]))

    # ---- Chat Completions ----

    def test_chat_non_streaming(self):
        r = self.oa.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "[[answer]]"}],
            extra_body=NO_THINKING)
        self.assertEqual(r.choices[0].message.content, GREETING)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        # Model output (no scripted rule): the V4.1 forward generates max_tokens tokens or EOS.
        r = self.oa.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Say something."}],
            max_tokens=6, temperature=0, extra_body=NO_THINKING)
        self.assertIn(r.choices[0].finish_reason, ("length", "stop"))
        self.assertLessEqual(r.usage.completion_tokens, 6)
        self.assertGreater(r.usage.completion_tokens, 0)

    def test_chat_streaming_thinking(self):
        chunks = list(self.oa.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "[[think-answer]]"}],
            stream=True, stream_options={"include_usage": True}))
        reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                            for c in chunks if c.choices)
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(reasoning, "The user greets me; answer briefly.")
        self.assertEqual(content, GREETING)
        self.assertGreater(chunks[-1].usage.completion_tokens_details.reasoning_tokens, 0)

    def test_chat_tool_calls_and_parallel_off(self):
        for stream in (False, True):
            for parallel in (True, False):
                with self.subTest(stream=stream, parallel=parallel):
                    kw = dict(model=MODEL_NAME, tools=[WEATHER_TOOL], extra_body=NO_THINKING,
                              parallel_tool_calls=parallel,
                              messages=[{"role": "user", "content": "Weather? [[two-tools]]"}])
                    if stream:
                        with self.oa.chat.completions.stream(**kw) as s:
                            for _ in s:
                                pass
                            r = s.get_final_completion()
                    else:
                        r = self.oa.chat.completions.create(**kw)
                    c = r.choices[0]
                    self.assertEqual(c.finish_reason, "tool_calls")
                    self.assertEqual([json.loads(t.function.arguments)["city"]
                                      for t in c.message.tool_calls],
                                     ["Paris", "Rome"] if parallel else ["Paris"])

    # ---- Responses ----

    def test_responses(self):
        r = self.oa.responses.create(model=MODEL_NAME, input="[[think-answer]]")
        self.assertEqual(r.status, "completed")
        self.assertEqual(r.output_text, GREETING)
        self.assertEqual([i.type for i in r.output], ["reasoning", "message"])
        with self.oa.responses.stream(model=MODEL_NAME, input="[[answer]]",
                                      reasoning={"effort": "none"}) as s:
            final = s.get_final_response()
        self.assertEqual(final.output_text, GREETING)
        r = self.oa.responses.create(
            model=MODEL_NAME, input="Weather? [[two-tools]]", reasoning={"effort": "none"},
            parallel_tool_calls=False,
            tools=[{"type": "function", "name": "get_weather",
                    "parameters": WEATHER_TOOL["function"]["parameters"]}])
        self.assertFalse(r.parallel_tool_calls)
        self.assertEqual([i.name for i in r.output if i.type == "function_call"], ["get_weather"])

    # ---- Anthropic Messages ----

    def test_messages(self):
        m = self.an.messages.create(model=MODEL_NAME, max_tokens=256,
                                    thinking={"type": "enabled", "budget_tokens": 1024},
                                    messages=[{"role": "user", "content": "[[think-answer]]"}])
        self.assertEqual([b.type for b in m.content], ["thinking", "text"])
        self.assertEqual(m.content[1].text, GREETING)
        self.assertEqual(m.stop_reason, "end_turn")
        with self.an.messages.stream(model=MODEL_NAME, max_tokens=256,
                                     thinking={"type": "disabled"},
                                     messages=[{"role": "user", "content": "[[answer]]"}]) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        self.assertEqual(text, GREETING)
        self.assertEqual(final.stop_reason, "end_turn")
        m = self.an.messages.create(
            model=MODEL_NAME, max_tokens=256, thinking={"type": "disabled"},
            tools=[{"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
            messages=[{"role": "user", "content": "Weather? [[two-tools]]"}])
        self.assertEqual([b.input for b in m.content if b.type == "tool_use"], [{"city": "Paris"}])

    # ---- image content: a clear 400 in each protocol's shape ----

    def test_image_content_is_refused(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            self.oa.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": IMAGE_URL}}]}])
        err = cm.exception.body
        self.assertEqual(err["type"], "invalid_request_error")
        self.assertEqual(err["param"], "messages")
        self.assertIn("V4.1", err["message"])
        self.assertIn("image", err["message"])
        with self.assertRaises(openai.BadRequestError) as cm:
            self.oa.responses.create(model=MODEL_NAME, input=[{"role": "user", "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": IMAGE_URL}]}])
        self.assertEqual(cm.exception.body["param"], "input")
        self.assertIn("V4.1", cm.exception.body["message"])
        with self.assertRaises(anthropic.BadRequestError) as cm:
            self.an.messages.create(model=MODEL_NAME, max_tokens=16, messages=[
                {"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": "iVBORw0KGgo="}},
                    {"type": "text", "text": "What is this?"}]}])
        body = cm.exception.body
        self.assertEqual(body["type"], "error")
        self.assertEqual(body["error"]["type"], "invalid_request_error")
        self.assertIn("V4.1", body["error"]["message"])
        # An image inside a tool result too (V4 renders it as "[Unsupported image]" text).
        with self.assertRaises(anthropic.BadRequestError) as cm:
            self.an.messages.create(model=MODEL_NAME, max_tokens=16, messages=[
                {"role": "user", "content": "Take a screenshot."},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                     "data": "iVBORw0KGgo="}}]}]}])
        self.assertIn("tool_result", cm.exception.body["error"]["message"])
        self.assertIn("V4.1", cm.exception.body["error"]["message"])
        # The placeholder's spelling in text stays text (it is not in this tokenizer anyway).
        r = self.oa.chat.completions.create(
            model=MODEL_NAME, max_tokens=64, extra_body=NO_THINKING,
            messages=[{"role": "user", "content": "<｜deepseek_image｜><image> [[answer]]"}])
        self.assertEqual(r.choices[0].message.content, GREETING)
        # The server keeps serving.
        self.assertEqual(self.server.get("/health")[0], 200)

    # ---- /metrics: the V4.1 state footprint ----

    def test_metrics_state_footprint(self):
        r = subprocess.run([harness.dsinfer_bin(), "inspect", "--model", self.model, "--json"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        info = json.loads(r.stdout)
        self.assertEqual(info["model"], "deepseek_v4.1")
        layout = info["config"]["state"]
        m = self.server.metrics()
        per_token = m["dsinfer_state_bytes_per_token"]
        fixed = m["dsinfer_state_sequence_fixed_bytes"]
        # Pages of the V4.1 layout: at least its compressed KV + index keys per token and its
        # window / compressor rings per sequence, within page rounding.
        self.assertGreaterEqual(per_token, layout["kv_bytes_per_token"])
        self.assertLess(per_token, 16 * layout["kv_bytes_per_token"])
        self.assertGreaterEqual(fixed, layout["state_bytes_per_sequence"])
        self.assertGreater(m["dsinfer_state_max_context_tokens"], 0)
        self.assertEqual(m['dsinfer_state_memory_bytes{kind="total"}'], 256 << 20)


if __name__ == "__main__":
    harness.run_tests()
