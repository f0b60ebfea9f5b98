"""The official `anthropic` Python SDK, unmodified, against `dsinfer serve` (Messages API, also
under DeepSeek's /anthropic prefix): streaming (the SDK's MessageStream accumulator) and not,
thinking on/off, tool use, stop sequences, max_tokens, usage and errors. Scripted output as in
test_openai_sdk.py.
"""

import harness
from harness import MODEL_NAME

harness.require()

import anthropic  # noqa: E402

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {"type": "object",
                     "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                     "required": ["city"]},
}
NO_THINKING = {"type": "disabled"}
THINKING = {"type": "enabled", "budget_tokens": 1024}
GREETING = "Hello! How can I help?"
SECOND_NAME = "second-name"


class AnthropicSDK(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Two served names (--served-model-name is repeatable): both are answered.
        cls.server = harness.Server("--served-model-name", SECOND_NAME, api_key="test-key")
        cls.client = anthropic.Anthropic(base_url=cls.server.url, api_key="test-key",
                                         max_retries=0, timeout=60)
        # DeepSeek's path: https://api.deepseek.com/anthropic
        cls.alias = anthropic.Anthropic(base_url=cls.server.url + "/anthropic",
                                        api_key="test-key", max_retries=0, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)

    def create(self, content, client=None, **kw):
        kw.setdefault("max_tokens", 256)
        return (client or self.client).messages.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": content}], **kw)

    def stream(self, content, **kw):
        kw.setdefault("max_tokens", 256)
        with self.client.messages.stream(
                model=MODEL_NAME, messages=[{"role": "user", "content": content}], **kw) as s:
            text = "".join(s.text_stream)
            return text, s.get_final_message()

    def test_non_streaming_thinking_off(self):
        m = self.create("[[answer]]", thinking=NO_THINKING)
        self.assertEqual(m.type, "message")
        self.assertEqual(m.role, "assistant")
        self.assertEqual(m.model, MODEL_NAME)
        self.assertEqual([b.type for b in m.content], ["text"])
        self.assertEqual(m.content[0].text, GREETING)
        self.assertEqual(m.stop_reason, "end_turn")
        self.assertGreater(m.usage.input_tokens, 0)
        self.assertGreater(m.usage.output_tokens, 0)

    def test_thinking_on(self):
        m = self.create("[[think-answer]]", thinking=THINKING)
        self.assertEqual([b.type for b in m.content], ["thinking", "text"])
        self.assertEqual(m.content[0].thinking, "The user greets me; answer briefly.")
        self.assertEqual(m.content[1].text, GREETING)

    def test_stream_accumulator_matches_non_streaming(self):
        ref = self.create("[[think-answer]]", thinking=THINKING)
        text, final = self.stream("[[think-answer]]", thinking=THINKING)
        self.assertEqual(text, GREETING)
        self.assertEqual([b.model_dump() for b in final.content],
                         [b.model_dump() for b in ref.content])
        self.assertEqual(final.stop_reason, "end_turn")
        self.assertEqual(final.usage.output_tokens, ref.usage.output_tokens)
        self.assertEqual(final.usage.input_tokens, ref.usage.input_tokens)

    def test_alias_prefix(self):
        m = self.create("[[answer]]", client=self.alias, thinking=NO_THINKING)
        self.assertEqual(m.content[0].text, GREETING)
        with self.alias.messages.stream(model=MODEL_NAME, max_tokens=64, thinking=NO_THINKING,
                                        messages=[{"role": "user", "content": "[[unicode]]"}]) as s:
            self.assertEqual(s.get_final_message().content[0].text, "héllo wörld 你好 🙂 done")

    def test_tool_use(self):
        for stream in (False, True):
            for marker, thinking in (("[[tool-think]]", THINKING), ("[[tool]]", NO_THINKING)):
                with self.subTest(stream=stream, marker=marker):
                    kw = dict(tools=[WEATHER_TOOL], thinking=thinking)
                    if stream:
                        _, m = self.stream("Weather? " + marker, **kw)
                    else:
                        m = self.create("Weather? " + marker, **kw)
                    self.assertEqual(m.stop_reason, "tool_use")
                    tools = [b for b in m.content if b.type == "tool_use"]
                    self.assertEqual(len(tools), 1)
                    self.assertEqual(tools[0].name, "get_weather")
                    self.assertEqual(tools[0].input, {"city": "Paris", "days": 3})
                    self.assertTrue(tools[0].id)
                    texts = [b.text for b in m.content if b.type == "text"]
                    self.assertEqual(texts, ["Let me check."])

    def test_disable_parallel_tool_use(self):
        """tool_choice.disable_parallel_tool_use: one tool_use block per turn (the output ends
        after the first call); without it both scripted calls come back."""
        for stream in (False, True):
            for disable in (None, False, True):
                with self.subTest(stream=stream, disable=disable):
                    choice = {"type": "auto"}
                    if disable is not None:
                        choice["disable_parallel_tool_use"] = disable
                    kw = dict(tools=[WEATHER_TOOL], thinking=NO_THINKING, tool_choice=choice)
                    if stream:
                        _, m = self.stream("Weather? [[two-tools]]", **kw)
                    else:
                        m = self.create("Weather? [[two-tools]]", **kw)
                    self.assertEqual(m.stop_reason, "tool_use")
                    cities = [b.input["city"] for b in m.content if b.type == "tool_use"]
                    self.assertEqual(cities, ["Paris"] if disable else ["Paris", "Rome"])
        with self.assertRaises(anthropic.BadRequestError) as cm:
            self.create("x", tools=[WEATHER_TOOL], thinking=NO_THINKING,
                        tool_choice={"type": "auto", "disable_parallel_tool_use": "yes"})
        self.assertIn("disable_parallel_tool_use", str(cm.exception))

    def test_tool_round_trip(self):
        first = self.create("Weather in Paris? [[tool-think]]", tools=[WEATHER_TOOL],
                            thinking=THINKING)
        call = next(b for b in first.content if b.type == "tool_use")
        m = self.client.messages.create(
            model=MODEL_NAME, max_tokens=256, tools=[WEATHER_TOOL], thinking=THINKING,
            messages=[{"role": "user", "content": "Weather in Paris? [[tool-think]]"},
                      {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                    "content": "Sunny, 21°C [[final]]"}]}])
        self.assertEqual(m.content[-1].text, "It is sunny in Paris, 21°C.")
        self.assertEqual(m.stop_reason, "end_turn")

    def test_stop_sequences(self):
        for stream in (False, True):
            with self.subTest(stream=stream):
                kw = dict(stop_sequences=["STOP"], thinking=NO_THINKING)
                m = self.stream("[[stop]]", **kw)[1] if stream else self.create("[[stop]]", **kw)
                self.assertEqual(m.content[0].text, "one two three ")
                self.assertEqual(m.stop_reason, "stop_sequence")
                self.assertEqual(m.stop_sequence, "STOP")

    def test_max_tokens(self):
        m = self.create("[[long]]", max_tokens=5, thinking=NO_THINKING)
        self.assertEqual(m.stop_reason, "max_tokens")
        self.assertEqual(m.usage.output_tokens, 5)
        _, s = self.stream("[[long]]", max_tokens=5, thinking=NO_THINKING)
        self.assertEqual(s.stop_reason, "max_tokens")

    def test_model_generates(self):
        m = self.create("Say something.", max_tokens=6, thinking=NO_THINKING)
        self.assertIn(m.stop_reason, ("end_turn", "max_tokens"))
        self.assertLessEqual(m.usage.output_tokens, 6)
        text, s = self.stream("Say something.", max_tokens=6, thinking=NO_THINKING)
        self.assertIn(s.stop_reason, ("end_turn", "max_tokens"))
        self.assertEqual(text, "".join(b.text for b in s.content if b.type == "text"))

    def test_second_served_name(self):
        m = self.client.messages.create(model=SECOND_NAME, max_tokens=64, thinking=NO_THINKING,
                                        messages=[{"role": "user", "content": "[[answer]]"}])
        self.assertEqual(m.model, SECOND_NAME)
        self.assertEqual(m.content[0].text, GREETING)
        ids = [x.id for x in self.client.models.list()]
        self.assertEqual(ids, [MODEL_NAME, SECOND_NAME])

    def test_errors(self):
        with self.assertRaises(anthropic.BadRequestError) as e:
            self.client.messages.create(model=MODEL_NAME, max_tokens=10, messages=[])
        self.assertEqual(e.exception.body["type"], "error")
        self.assertEqual(e.exception.body["error"]["type"], "invalid_request_error")
        with self.assertRaises(anthropic.BadRequestError) as e:
            self.create("x", extra_body={"temperature": 3})
        self.assertIn("temperature", str(e.exception))
        with self.assertRaises(anthropic.BadRequestError):
            self.create("x", max_tokens=0)
        with self.assertRaises(anthropic.NotFoundError) as e:
            self.client.messages.create(model="gpt-4o", max_tokens=10,
                                        messages=[{"role": "user", "content": "x"}])
        self.assertIn("gpt-4o", str(e.exception))
        self.assertEqual(e.exception.status_code, 404)
        self.assertEqual(e.exception.body["error"]["type"], "not_found_error")
        with self.assertRaises(anthropic.NotFoundError):
            with self.client.messages.stream(model="gpt-4o", max_tokens=10,
                                             messages=[{"role": "user", "content": "x"}]) as s:
                s.get_final_message()
        bad = anthropic.Anthropic(base_url=self.server.url, api_key="wrong", max_retries=0)
        with self.assertRaises(anthropic.AuthenticationError) as e:
            bad.messages.create(model=MODEL_NAME, max_tokens=10,
                                messages=[{"role": "user", "content": "x"}])
        self.assertEqual(e.exception.body["error"]["type"], "authentication_error")


if __name__ == "__main__":
    harness.run_tests()
