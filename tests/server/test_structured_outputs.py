"""Structured outputs through the official `openai` SDK against `dsinfer serve` on the bundled
model: Chat Completions `response_format` (json_object, json_schema), Responses `text.format`,
vLLM's `structured_outputs` / `guided_*` extensions (regex, EBNF), their 400s, and a corpus of 50
JSON schemas (schema_corpus.py) whose every output must validate (jsonschema). Thinking is off:
the answer content is what the grammar constrains (the reasoning block is left free).

DSINFER_SO_CORPUS_LIMIT=N runs only the first N corpus schemas (quick local runs).
"""

import json
import os
import re
import time

import harness
from harness import MODEL_NAME

harness.require()

import openai  # noqa: E402

try:
    import jsonschema  # noqa: E402
except ImportError:
    harness.skip("jsonschema missing; see scripts/deps.sh dsi_install_python_server_test_deps")

import schema_corpus  # noqa: E402

NO_THINKING = {"thinking": {"type": "disabled"}}
MAX_TOKENS = 400
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}


def validate(instance, schema):
    v = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    v.validate(instance)


class StructuredOutputs(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = harness.Server(scripted=False)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="unused",
                                   max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)

    def chat(self, content, **kw):
        extra = dict(NO_THINKING)
        extra.update(kw.pop("extra_body", {}))
        kw.setdefault("max_tokens", MAX_TOKENS)
        kw.setdefault("temperature", 0.7)
        kw.setdefault("seed", 1)
        return self.client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": content}],
            extra_body=extra, **kw)

    def json_schema_format(self, schema, name="out"):
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                       "strict": True}}

    # ---- Chat Completions response_format ----

    def test_json_schema(self):
        r = self.chat("Describe a person as JSON.",
                      response_format=self.json_schema_format(PERSON))
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "stop", c.message.content)
        validate(json.loads(c.message.content), PERSON)

    def test_json_schema_streaming(self):
        stream = self.chat("Describe a person as JSON.", stream=True, seed=5,
                           response_format=self.json_schema_format(PERSON))
        text, finish = "", None
        for chunk in stream:
            for ch in chunk.choices:
                text += ch.delta.content or ""
                finish = ch.finish_reason or finish
        self.assertEqual(finish, "stop", text)
        validate(json.loads(text), PERSON)

    def test_json_object(self):
        # Any object: nothing bounds its strings, and the bundled model (trained on Python code)
        # may write one until max_tokens. Every finished output must be an object; a cut-off one
        # must still be the start of one.
        finished = 0
        for seed in (3, 4, 5, 6):
            r = self.chat("Reply with a JSON object.", response_format={"type": "json_object"},
                          seed=seed)
            c = r.choices[0]
            self.assertTrue(c.message.content.startswith("{"), c.message.content)
            if c.finish_reason == "stop":
                self.assertIsInstance(json.loads(c.message.content), dict)
                finished += 1
            else:
                self.assertEqual(c.finish_reason, "length")
        # Measured: none of these seeds finishes within MAX_TOKENS (the model writes one key
        # string until the budget ends); reported, not hidden: docs/server.md.
        print(f"json_object: {finished} of 4 finished within {MAX_TOKENS} tokens")

    def test_n_choices_each_valid(self):
        r = self.chat("Describe a person as JSON.", n=3,
                      response_format=self.json_schema_format(PERSON))
        self.assertEqual(len(r.choices), 3)
        for c in r.choices:
            self.assertEqual(c.finish_reason, "stop", c.message.content)
            validate(json.loads(c.message.content), PERSON)

    def test_thinking_mode_constrains_only_the_answer(self):
        # Thinking on: the reasoning is free, the answer after `</think>` follows the schema. The
        # bundled model closes its thinking block within the budget for some seeds only (measured
        # with seeds 1-3: seed 3 does; seed 1 ends inside the reasoning, seed 2 runs out of
        # tokens); every answer it gives must validate.
        answered = 0
        for seed in (1, 2, 3):
            r = self.client.chat.completions.create(
                model=MODEL_NAME, messages=[{"role": "user", "content": "Give a person as json"}],
                max_tokens=800, seed=seed, response_format=self.json_schema_format(PERSON))
            c = r.choices[0]
            if c.message.content:
                self.assertEqual(c.finish_reason, "stop", c.message.content)
                self.assertTrue(getattr(c.message, "reasoning_content", None))
                validate(json.loads(c.message.content), PERSON)
                answered += 1
        self.assertGreater(answered, 0)

    # ---- Responses text.format ----

    def test_responses_text_format(self):
        r = self.client.responses.create(
            model=MODEL_NAME, input="Describe a person as JSON.", max_output_tokens=MAX_TOKENS,
            reasoning={"effort": "none"},
            text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                             "strict": True}})
        self.assertEqual(r.status, "completed", r.output_text)
        validate(json.loads(r.output_text), PERSON)

    # ---- vLLM extensions ----

    def test_guided_regex(self):
        pattern = r"[0-9]{3}-[a-z]{2,5}"
        for body in ({"guided_regex": pattern}, {"structured_outputs": {"regex": pattern}}):
            r = self.chat("Give a code.", extra_body=body)
            c = r.choices[0]
            self.assertEqual(c.finish_reason, "stop", c.message.content)
            self.assertTrue(re.fullmatch(pattern, c.message.content), c.message.content)

    def test_guided_grammar(self):
        grammar = 'root ::= "def " name "(" name "):"\nname ::= [a-z_]{1,12}'
        r = self.chat("Write a function header.",
                      extra_body={"structured_outputs": {"grammar": grammar}})
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "stop", c.message.content)
        self.assertTrue(re.fullmatch(r"def [a-z_]{1,12}\([a-z_]{1,12}\):", c.message.content),
                        c.message.content)

    def test_guided_json(self):
        r = self.chat("Describe a person as JSON.", extra_body={"guided_json": PERSON})
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "stop", c.message.content)
        validate(json.loads(c.message.content), PERSON)

    # ---- errors: 400 in the protocol's shape, and the server keeps serving ----

    def test_bad_values_are_400(self):
        cases = [
            dict(response_format=self.json_schema_format({"type": "no-such-type"})),
            dict(extra_body={"guided_regex": "(unclosed"}),
            dict(extra_body={"structured_outputs": {"grammar": "root ::= missing_rule"}}),
            dict(extra_body={"guided_json": "{not json"}),
            dict(extra_body={"guided_regex": 12}),
            dict(extra_body={"guided_regex": "a", "guided_json": PERSON}),
            dict(response_format={"type": "json_object"}, extra_body={"guided_regex": "a"}),
        ]
        for kw in cases:
            with self.assertRaises(openai.BadRequestError, msg=str(kw)) as e:
                self.chat("Reply in json.", **kw)
            self.assertEqual(e.exception.status_code, 400)
            self.assertEqual(e.exception.body["type"], "invalid_request_error", str(kw))
        with self.assertRaises(openai.BadRequestError):
            self.client.responses.create(
                model=MODEL_NAME, input="json please", reasoning={"effort": "none"},
                text={"format": {"type": "json_schema", "name": "x",
                                 "schema": {"type": "object", "properties": {
                                     "a": {"type": "no-such-type"}}}}})
        # Still serving.
        r = self.chat("Describe a person as JSON.",
                      response_format=self.json_schema_format(PERSON))
        validate(json.loads(r.choices[0].message.content), PERSON)

    def test_catastrophic_regexes(self):
        # Patterns that make a backtracking matcher take exponential time, or that blow up a
        # naive automaton, are no problem here (regexes compile to grammars matched token by
        # token): each is served quickly and the output matches. Constructs a regular grammar
        # cannot express (backreferences, lookaround) are a clear 400. The server keeps serving.
        served = [r"(a*)*b", r"(a|aa){1,5000}b", r"(x+x+)+y", r"((a+)+)+c",
                  r"(a{1,1000}){1,1000}", r"[a-z]{1,1000000}", r"(\w{1,50}\.){1,50}\w{1,50}"]
        for pattern in served:
            t0 = time.time()
            r = self.chat("Write something.", max_tokens=24, extra_body={"guided_regex": pattern})
            dt = time.time() - t0
            c = r.choices[0]
            self.assertLess(dt, 30, pattern)
            if c.finish_reason == "stop":
                self.assertTrue(re.fullmatch(pattern, c.message.content),
                                (pattern, c.message.content))
            else:  # cut at max_tokens: a prefix of a match
                self.assertEqual(c.finish_reason, "length")
        for pattern, why in ((r"(a)\1", "Backreference"), (r"(?=a)a", "Lookahead"),
                             (r"(?<!a)b", "")):
            with self.assertRaises(openai.BadRequestError, msg=pattern) as e:
                self.chat("x", extra_body={"guided_regex": pattern})
            msg = e.exception.body["message"]
            self.assertIn("invalid regex", msg)
            self.assertIn(why, msg)
            self.assertNotIn(".cc:", msg)  # no source locations of the grammar engine
        r = self.chat("Give a code.", extra_body={"guided_regex": "[0-9]{3}"})
        self.assertTrue(re.fullmatch("[0-9]{3}", r.choices[0].message.content))

    # ---- the corpus ----

    def test_schema_corpus(self):
        # Every output must finish (within MAX_TOKENS) and validate.
        limit = int(os.environ.get("DSINFER_SO_CORPUS_LIMIT", "0")) or len(schema_corpus.SCHEMAS)
        failures = []
        valid = 0
        tokens = 0
        t0 = time.time()
        for i, schema in enumerate(schema_corpus.SCHEMAS[:limit]):
            r = self.chat("Reply with JSON matching the schema.", seed=100 + i,
                          response_format=self.json_schema_format(schema, f"s{i}"))
            c = r.choices[0]
            tokens += r.usage.completion_tokens
            try:
                if c.finish_reason != "stop":
                    raise ValueError(f"finish_reason {c.finish_reason}")
                validate(json.loads(c.message.content), schema)
                valid += 1
            except Exception as e:  # noqa: BLE001 (collected, reported together)
                failures.append(f"schema {i}: {e}: {c.message.content!r}"[:400])
        print(f"corpus: {limit} schemas, {valid} finished and valid, {len(failures)} failures, "
              f"{tokens} tokens, {time.time() - t0:.1f}s")
        self.assertEqual(failures, [], "\n".join(failures))

    # ---- overhead per step ----

    def test_grammar_overhead_per_step(self):
        # Decode milliseconds per token (streamed: first to last content chunk over the tokens
        # between them; one request at a time, 3 alternating rounds, best of each) without a
        # grammar and under two grammars that keep the bundled model writing to max_tokens.
        # Printed for the test log (this machine is shared: no bound on the difference).
        n = 160
        notes = {"type": "object", "properties": {"notes": {"type": "string", "minLength": 600}},
                 "required": ["notes"]}
        kinds = {
            "none": {},
            "regex [a-z ,.]+": {"extra_body": {"guided_regex": "[a-z ,.]+"}},
            "json_schema (long string)": {"response_format": self.json_schema_format(notes)},
        }
        best = {k: None for k in kinds}
        for _ in range(3):
            for k, kw in kinds.items():
                first = last = None
                tokens = 0
                for chunk in self.chat("Write a long list of notes about rivers.", max_tokens=n,
                                       seed=9, stream=True, stream_options={"include_usage": True},
                                       **kw):
                    if chunk.choices and chunk.choices[0].delta.content:
                        last = time.perf_counter()
                        first = first or last
                    if chunk.usage:
                        tokens = chunk.usage.completion_tokens
                self.assertGreater(tokens, 20, k)
                ms = 1e3 * (last - first) / (tokens - 1)
                best[k] = ms if best[k] is None else min(best[k], ms)
        print("decode ms/token, one request: " +
              ", ".join(f"{k}: {v:.2f}" for k, v in best.items()))


if __name__ == "__main__":
    harness.unittest.main()
