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

    # ---- the corpus ----

    def test_schema_corpus(self):
        # Every output must validate. The exception, listed in schema_corpus.UNFINISHED: schemas
        # the bundled model does not finish within MAX_TOKENS (it writes an unbounded string
        # until the budget ends; the output is cut, not invalid): those must still be cut off
        # ("length"), so that one starting to finish is noticed and moved back to the checked set.
        limit = int(os.environ.get("DSINFER_SO_CORPUS_LIMIT", "0")) or len(schema_corpus.SCHEMAS)
        failures = []
        valid = 0
        t0 = time.time()
        for i, schema in enumerate(schema_corpus.SCHEMAS[:limit]):
            r = self.chat("Reply with JSON matching the schema.", seed=100 + i,
                          response_format=self.json_schema_format(schema, f"s{i}"))
            c = r.choices[0]
            try:
                if i in schema_corpus.UNFINISHED:
                    if c.finish_reason != "length" or not c.message.content.startswith("{"):
                        raise ValueError(f"listed as unfinished, got {c.finish_reason}")
                    continue
                if c.finish_reason != "stop":
                    raise ValueError(f"finish_reason {c.finish_reason}")
                validate(json.loads(c.message.content), schema)
                valid += 1
            except Exception as e:  # noqa: BLE001 (collected, reported together)
                failures.append(f"schema {i}: {e}: {c.message.content!r}"[:400])
        print(f"corpus: {limit} schemas, {valid} finished and valid, "
              f"{len([i for i in schema_corpus.UNFINISHED if i < limit])} cut off at "
              f"{MAX_TOKENS} tokens (listed), {len(failures)} failures, {time.time() - t0:.1f}s")
        self.assertEqual(failures, [], "\n".join(failures))


if __name__ == "__main__":
    harness.unittest.main()
