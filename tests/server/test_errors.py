"""Bad input over raw HTTP: every failure is the protocol's 4xx error body naming the problem
(OpenAI shape for /v1/chat/completions and /v1/responses, Anthropic shape for /v1/messages):
malformed JSON, wrong types, unknown model, over-long prompt, oversized body, invalid sampling
values, unknown routes and methods, authentication, and 429 + Retry-After on a full queue.
"""

import asyncio
import json

import harness
from harness import MODEL_NAME

harness.require(sdks=False)

CHAT = "/v1/chat/completions"
RESP = "/v1/responses"
MSGS = "/v1/messages"


def user(text="hi"):
    return [{"role": "user", "content": text}]


class Errors(harness.unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = harness.Server("--max-prompt-tokens", "64", "--max-body-bytes", "32KiB")

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)

    def openai_error(self, path, body, status=400):
        code, _, raw = self.server.post(path, body)
        self.assertEqual(code, status, raw)
        err = json.loads(raw)["error"]
        self.assertIsInstance(err["message"], str)
        self.assertIn("type", err)
        self.assertIn("code", err)
        self.assertIn("param", err)
        return err

    def anthropic_error(self, body, status=400, path=MSGS):
        code, _, raw = self.server.post(path, body)
        self.assertEqual(code, status, raw)
        doc = json.loads(raw)
        self.assertEqual(doc["type"], "error")
        self.assertIsInstance(doc["error"]["message"], str)
        return doc["error"]

    def test_malformed_json(self):
        for body in ("{", "[1,2]", "null", "", '{"model": "x",}', "\xff\xfe"):
            with self.subTest(body=body):
                self.assertEqual(self.openai_error(CHAT, body)["type"], "invalid_request_error")
                self.openai_error(RESP, body)
                self.assertEqual(self.anthropic_error(body)["type"], "invalid_request_error")

    def test_wrong_types(self):
        e = self.openai_error(CHAT, {"model": MODEL_NAME, "messages": "hi"})
        self.assertEqual(e["param"], "messages")
        e = self.openai_error(CHAT, {"model": MODEL_NAME, "messages": user(), "max_tokens": "9"})
        self.assertEqual(e["param"], "max_tokens")
        e = self.openai_error(CHAT, {"model": MODEL_NAME, "messages": user(), "stream": "yes"})
        self.assertEqual(e["param"], "stream")
        e = self.openai_error(RESP, {"model": MODEL_NAME, "input": 42})
        self.assertEqual(e["param"], "input")
        e = self.anthropic_error({"model": MODEL_NAME, "max_tokens": 5, "messages": [{"role": 1}]})
        self.assertIn("role", e["message"])
        e = self.anthropic_error({"model": MODEL_NAME, "messages": user()})
        self.assertIn("max_tokens", e["message"])

    def test_unknown_model(self):
        # 404 model_not_found (OpenAI and vLLM), Anthropic's not_found_error.
        for path, body in ((CHAT, {"model": "gpt-nope", "messages": user()}),
                           (RESP, {"model": "gpt-nope", "input": "x"})):
            e = self.openai_error(path, body, status=404)
            self.assertEqual(e["code"], "model_not_found")
            self.assertEqual(e["type"], "invalid_request_error")
            self.assertIn("gpt-nope", e["message"])
            self.assertIn(MODEL_NAME, e["message"])
        e = self.anthropic_error({"model": "gpt-nope", "max_tokens": 5, "messages": user()},
                                 status=404)
        self.assertEqual(e["type"], "not_found_error")
        self.assertIn("gpt-nope", e["message"])
        # A huge name is cut in the message; the server keeps serving.
        e = self.openai_error(CHAT, {"model": "m" * 20000, "messages": user()}, status=404)
        self.assertLess(len(e["message"]), 1024)
        e = self.anthropic_error({"model": "g" * 20000, "max_tokens": 5, "messages": user()},
                                 status=404)
        self.assertLess(len(e["message"]), 1024)
        code, _, _ = self.server.post(CHAT, {"model": MODEL_NAME, "messages": user(),
                                             "max_tokens": 2})
        self.assertEqual(code, 200)

    def test_over_long_prompt(self):
        text = " ".join(f"word{i}" for i in range(200))
        e = self.openai_error(CHAT, {"model": MODEL_NAME, "messages": user(text)})
        self.assertEqual(e["code"], "context_length_exceeded")
        self.assertEqual(e["param"], "messages")
        self.assertIn("at most 64 prompt tokens", e["message"])
        e = self.openai_error(RESP, {"model": MODEL_NAME, "input": text})
        self.assertEqual(e["param"], "input")
        e = self.anthropic_error({"model": MODEL_NAME, "max_tokens": 5, "messages": user(text)})
        self.assertIn("64 prompt tokens", e["message"])
        # prompt + max_tokens beyond the context
        e = self.openai_error(CHAT, {"model": MODEL_NAME, "messages": user(), "max_tokens": 10**6})
        self.assertEqual(e["param"], "max_tokens")

    def test_oversized_body(self):
        big = {"model": MODEL_NAME, "messages": user("x" * 40000)}
        e = self.openai_error(CHAT, big, status=413)
        self.assertIn("32768 bytes", e["message"])
        e = self.anthropic_error(dict(big, max_tokens=5), status=413)
        self.assertEqual(e["type"], "request_too_large")
        # The server still answers afterwards.
        self.assertEqual(self.server.get("/health")[0], 200)

    def test_invalid_sampling_values(self):
        for field, value in (("temperature", -1), ("temperature", 2.5), ("top_p", 0),
                             ("top_p", 1.5), ("frequency_penalty", 3), ("presence_penalty", -3),
                             ("max_tokens", 0), ("top_logprobs", 50), ("seed", "x")):
            with self.subTest(field=field, value=value):
                e = self.openai_error(CHAT, {"model": MODEL_NAME, "messages": user(),
                                             field: value})
                self.assertEqual(e["param"], field)
        # (top_k is accepted and ignored, as DeepSeek does; only its type is checked.)
        for field, value in (("temperature", 2.5), ("top_p", -0.5), ("top_k", "x"),
                             ("max_tokens", -5)):
            with self.subTest(field=field, value=value):
                e = self.anthropic_error({"model": MODEL_NAME, "max_tokens": 5,
                                          "messages": user(), field: value})
                self.assertIn(field, e["message"])
        e = self.openai_error(RESP, {"model": MODEL_NAME, "input": "x", "top_p": 2})
        self.assertEqual(e["param"], "top_p")
        for n in (0, 17, 10**6):
            e = self.openai_error(CHAT, {"model": MODEL_NAME, "messages": user(), "n": n})
            self.assertEqual(e["param"], "n")

    def test_routes_and_methods(self):
        code, _, raw = self.server.get("/v2/whatever")
        self.assertEqual(code, 404)
        self.assertIn("error", json.loads(raw))
        code, headers, _ = self.server.get(CHAT)
        self.assertEqual(code, 405)
        self.assertEqual(headers.get("Allow"), "POST")
        code, _, raw = self.server.get(MSGS)
        self.assertEqual(code, 405)
        self.assertEqual(json.loads(raw)["type"], "error")

    def test_metrics_count_errors(self):
        m = self.server.metrics()
        self.assertGreater(m.get(f'dsinfer_requests_total{{endpoint="{CHAT}",status="400"}}', 0),
                           0)


class Auth(harness.unittest.TestCase):
    def test_api_key(self):
        with harness.Server(api_key="k3y") as s:
            body = {"model": MODEL_NAME, "messages": user("[[answer]]")}
            code, _, raw = s.post(CHAT, body, headers={})
            self.assertEqual(code, 401)
            self.assertEqual(json.loads(raw)["error"]["code"], "invalid_api_key")
            code, _, raw = s.post(MSGS, dict(body, max_tokens=5), headers={"x-api-key": "nope"})
            self.assertEqual(code, 401)
            self.assertEqual(json.loads(raw)["error"]["type"], "authentication_error")
            self.assertEqual(s.post(CHAT, body, headers={"Authorization": "Bearer k3y"})[0], 200)
            self.assertEqual(s.post(MSGS, dict(body, max_tokens=5),
                                    headers={"x-api-key": "k3y"})[0], 200)
            self.assertEqual(s.get("/health", headers={})[0], 200)
            self.assertEqual(s.get("/metrics", headers={})[0], 401)


class QueueFull(harness.unittest.TestCase):
    def test_429_only_when_the_queue_is_full(self):
        # One running slot and one queue slot; the engine is slowed so requests overlap.
        with harness.Server("--max-num-seqs", "1", "--max-queue", "1",
                            "--debug-step-delay-ms", "5") as s:
            asyncio.run(self._scenario(s))

    async def _scenario(self, s):
        long = {"model": MODEL_NAME, "stream": True, "thinking": {"type": "disabled"},
                "messages": user("[[long]]")}
        r1, w1, st1, _ = await harness.open_stream(s.port, CHAT, long)
        self.assertEqual(st1, 200)
        await r1.readline()
        # Request 2 waits in the queue (no response yet).
        q_reader, q_writer = await asyncio.open_connection("127.0.0.1", s.port)
        data = json.dumps(dict(long, stream=False)).encode()
        q_writer.write(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        await q_writer.drain()
        await asyncio.to_thread(s.wait_metric, lambda m: m["dsinfer_requests_in_flight"] == 2)
        r3, w3, st3, h3 = await harness.open_stream(s.port, CHAT, long)
        self.assertEqual(st3, 429)
        self.assertEqual(h3.get("retry-after"), "1")
        self.assertEqual(json.loads(await harness.read_body(r3, h3))["error"]["type"],
                         "rate_limit_exceeded")
        r4, w4, st4, h4 = await harness.open_stream(
            s.port, MSGS, {"model": MODEL_NAME, "max_tokens": 5, "messages": user()})
        self.assertEqual(st4, 429)
        self.assertEqual(json.loads(await harness.read_body(r4, h4))["error"]["type"],
                         "rate_limit_error")
        # Free both slots (disconnects abort), then requests are admitted again.
        for w in (w1, q_writer):
            w.close()
            await w.wait_closed()
        await asyncio.to_thread(s.wait_metric, lambda m: m["dsinfer_requests_in_flight"] == 0)
        code, _, _ = s.post(CHAT, {"model": MODEL_NAME, "messages": user("[[answer]]"),
                                   "thinking": {"type": "disabled"}})
        self.assertEqual(code, 200)
        m = s.metrics()
        self.assertEqual(m[f'dsinfer_requests_total{{endpoint="{CHAT}",status="429"}}'], 1)
        for w in (w3, w4):
            w.close()



def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class HugePrompts(harness.unittest.TestCase):
    """Issue 18: a 7 MB prompt is refused on a byte bound before tokenizing, quickly, and the
    server's memory does not keep the high-water mark."""

    def test_huge_prompts_are_refused_cheaply_and_memory_returns(self):
        with harness.Server("--max-body-bytes", "16MiB") as s:
            s.post(CHAT, {"model": MODEL_NAME, "messages": user(), "max_tokens": 2})
            before = rss_bytes(s.proc.pid)
            huge = "lorem ipsum dolor " * (7_000_000 // 18)
            for i in range(4):
                t0 = harness.time.time()
                code, _, raw = s.post(CHAT, {"model": MODEL_NAME, "messages": user(huge)})
                took = harness.time.time() - t0
                self.assertEqual(code, 400, raw[:300])
                self.assertEqual(json.loads(raw)["error"]["code"], "context_length_exceeded")
                self.assertLess(len(raw), 1024)
                self.assertLess(took, 3.0)
            after = rss_bytes(s.proc.pid)
            self.assertEqual(s.get("/health")[0], 200)
            print(f"RSS before {before / 2**20:.1f} MiB, after 4 x 7 MB prompts "
                  f"{after / 2**20:.1f} MiB")
            self.assertLess(after - before, 64 * 2**20, (before, after))


if __name__ == "__main__":
    harness.run_tests()
