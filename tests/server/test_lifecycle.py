"""Request lifecycle over loopback: a client that disconnects aborts its request and frees its
sequence state at once (visible in /metrics), per-request timeouts, and SIGTERM: stop accepting,
let in-flight requests finish within the grace period, abort the rest cleanly, exit 0.

The server runs with the test-only --debug-step-delay-ms so requests stay in flight long
enough to act on them.
"""

import asyncio
import json
import socket
import time

import harness
from harness import MODEL_NAME

harness.require(sdks=False)

CHAT = "/v1/chat/completions"
NO_THINKING = {"type": "disabled"}


def body_for(path, marker, stream=True, **extra):
    msgs = [{"role": "user", "content": marker}]
    if path == "/v1/responses":
        b = {"model": MODEL_NAME, "input": marker, "reasoning": {"effort": "none"}}
    elif path == "/v1/messages":
        b = {"model": MODEL_NAME, "messages": msgs, "max_tokens": 3000, "thinking": NO_THINKING}
    else:
        b = {"model": MODEL_NAME, "messages": msgs, "thinking": NO_THINKING}
    b["stream"] = stream
    b.update(extra)
    return b


def refused(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


class Disconnect(harness.unittest.TestCase):
    def test_disconnect_mid_stream_frees_state(self):
        with harness.Server("--debug-step-delay-ms", "5") as s:
            async def one(path, n):
                r, w, status, h = await harness.open_stream(s.port, path, body_for(path, "[[long]]"))
                self.assertEqual(status, 200)
                for _ in range(3):  # a few chunks of the stream
                    await harness.read_chunk(r)
                m = await asyncio.to_thread(
                    s.wait_metric, lambda m: m["dsinfer_running_requests"] == 1 and
                    m["dsinfer_state_memory_used_bytes"] > 0)
                self.assertGreater(m['dsinfer_state_memory_bytes{kind="used"}'], 0)
                w.close()
                await w.wait_closed()
                await asyncio.to_thread(
                    s.wait_metric, lambda m: m["dsinfer_running_requests"] == 0 and
                    m["dsinfer_state_memory_used_bytes"] == 0 and
                    m["dsinfer_requests_in_flight"] == 0 and
                    m['dsinfer_requests_aborted_total{reason="disconnect"}'] == n)

            async def scenario():
                for i, path in enumerate((CHAT, "/v1/messages", "/v1/responses")):
                    await one(path, i + 1)
            asyncio.run(scenario())
            m = s.metrics()
            self.assertEqual(m[f'dsinfer_requests_total{{endpoint="{CHAT}",status="499"}}'], 1)

    def test_disconnect_aborts_every_choice(self):
        # n = 3: three engine requests (choices 1 and 2 fork choice 0's prompt state); a client
        # that goes away mid-stream aborts all three and their state returns to the arena.
        with harness.Server("--debug-step-delay-ms", "5") as s:
            async def scenario():
                r, w, status, h = await harness.open_stream(
                    s.port, CHAT, body_for(CHAT, "[[long]]", n=3))
                self.assertEqual(status, 200)
                indexes = set()
                while len(indexes) < 3:  # every choice streams
                    chunk = await harness.read_chunk(r)
                    self.assertTrue(chunk, "the stream ended early")
                    for line in chunk.decode().splitlines():
                        if line.startswith("data: {"):
                            indexes.update(c["index"] for c in json.loads(line[6:])["choices"])
                m = await asyncio.to_thread(
                    s.wait_metric, lambda m: m["dsinfer_running_requests"] == 3)
                self.assertEqual(m["dsinfer_requests_in_flight"], 3)
                w.close()
                await w.wait_closed()
                await asyncio.to_thread(
                    s.wait_metric, lambda m: m["dsinfer_running_requests"] == 0 and
                    m["dsinfer_state_memory_used_bytes"] == 0 and
                    m["dsinfer_requests_in_flight"] == 0 and
                    m['dsinfer_requests_aborted_total{reason="disconnect"}'] == 3)
            asyncio.run(scenario())
            # The server keeps serving.
            code, _, raw = s.post(CHAT, body_for(CHAT, "[[answer]]", stream=False, n=2))
            self.assertEqual(code, 200, raw)
            choices = json.loads(raw)["choices"]
            self.assertEqual([c["index"] for c in choices], [0, 1])
            self.assertEqual(choices[0]["message"]["content"], choices[1]["message"]["content"])

    def test_disconnect_while_waiting_for_a_non_streaming_answer(self):
        with harness.Server("--debug-step-delay-ms", "5") as s:
            async def scenario():
                reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
                data = json.dumps(body_for(CHAT, "[[long]]", stream=False)).encode()
                writer.write(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                             f"\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
                await asyncio.to_thread(
                    s.wait_metric, lambda m: m["dsinfer_state_memory_used_bytes"] > 0)
                writer.close()
                await writer.wait_closed()
                await asyncio.to_thread(
                    s.wait_metric, lambda m: m["dsinfer_state_memory_used_bytes"] == 0 and
                    m['dsinfer_requests_aborted_total{reason="disconnect"}'] == 1)
            asyncio.run(scenario())


class Timeout(harness.unittest.TestCase):
    def test_request_timeout(self):
        with harness.Server("--debug-step-delay-ms", "5", "--request-timeout", "3") as s:
            t0 = time.time()
            code, _, raw = s.post(CHAT, body_for(CHAT, "[[long]]", stream=False))
            self.assertEqual(code, 504, raw)
            self.assertEqual(json.loads(raw)["error"]["type"], "timeout_error")
            self.assertLess(time.time() - t0, 15)
            code, _, raw = s.post(CHAT, body_for(CHAT, "[[long]]"))
            self.assertEqual(code, 200)
            frames = harness.parse_sse(raw.decode())
            self.assertEqual(frames[-1][1], "[DONE]")
            self.assertIn("error", json.loads(frames[-2][1]))
            code, _, raw = s.post("/v1/messages", body_for("/v1/messages", "[[long]]"))
            frames = harness.parse_sse(raw.decode())
            self.assertEqual(frames[-1][0], "error")
            m = s.wait_metric(lambda m: m["dsinfer_state_memory_used_bytes"] == 0)
            self.assertEqual(m['dsinfer_requests_aborted_total{reason="timeout"}'], 3)
            # Short requests are unaffected.
            code, _, raw = s.post(CHAT, body_for(CHAT, "[[answer]]", stream=False))
            self.assertEqual(code, 200)


class Shutdown(harness.unittest.TestCase):
    def test_sigterm_drains_in_flight_requests(self):
        s = harness.Server("--debug-step-delay-ms", "5")
        # An idle keep-alive connection must not hold the shutdown up.
        idle = socket.create_connection(("127.0.0.1", s.port))
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b"200 OK", idle.recv(4096))

        async def scenario():
            streams = []
            for path in (CHAT, "/v1/messages", "/v1/responses"):
                r, w, status, h = await harness.open_stream(s.port, path,
                                                            body_for(path, "[[medium]]"))
                self.assertEqual(status, 200)
                streams.append((path, r, w, h))
            first = await harness.read_chunk(streams[0][1])
            s.terminate()
            await asyncio.sleep(0.1)
            self.assertTrue(await asyncio.to_thread(refused, s.port))  # stopped accepting
            for i, (path, r, w, h) in enumerate(streams):
                body = ((first if i == 0 else b"") + await harness.read_body(r, h)).decode()
                frames = harness.parse_sse(body)
                last = {CHAT: (None, "[DONE]"), "/v1/messages": ("message_stop", None),
                        "/v1/responses": ("response.completed", None)}[path]
                self.assertEqual(frames[-1][0], last[0], body[-300:])
                if last[1]:
                    self.assertEqual(frames[-1][1], last[1])
                w.close()
        t0 = time.time()
        asyncio.run(scenario())
        self.assertEqual(s.stop(timeout=30), 0)
        self.assertLess(time.time() - t0, 20)
        idle.close()
        log = s.log_text()
        self.assertIn("received SIGTERM", log)
        self.assertIn("drained in", log)
        harness.check_log_has_no_text(log)

    def test_sigterm_aborts_what_outlives_the_grace_period(self):
        s = harness.Server("--debug-step-delay-ms", "5", "--shutdown-grace", "1")

        async def scenario():
            r, w, status, h = await harness.open_stream(s.port, CHAT, body_for(CHAT, "[[long]]"))
            self.assertEqual(status, 200)
            first = await harness.read_chunk(r)
            t0 = time.time()
            s.terminate()
            body = (first + await harness.read_body(r, h)).decode()
            self.assertLess(time.time() - t0, 6)
            frames = harness.parse_sse(body)
            self.assertEqual(frames[-1][1], "[DONE]")
            err = json.loads(frames[-2][1])["error"]
            self.assertIn("shutting down", err["message"])
            w.close()
        asyncio.run(scenario())
        self.assertEqual(s.stop(timeout=30), 0)
        log = s.log_text()
        self.assertIn("grace period over: aborting 1 request(s)", log)

    def test_second_sigterm_aborts_at_once(self):
        s = harness.Server("--debug-step-delay-ms", "5")  # default grace: 60 s

        async def scenario():
            r, w, status, h = await harness.open_stream(s.port, CHAT, body_for(CHAT, "[[long]]"))
            self.assertEqual(status, 200)
            first = await harness.read_chunk(r)
            s.terminate()
            await asyncio.sleep(0.3)
            t0 = time.time()
            s.proc.send_signal(harness.signal.SIGTERM)
            body = (first + await harness.read_body(r, h)).decode()
            self.assertLess(time.time() - t0, 6)
            self.assertIn("shutting down", body)
            w.close()
        asyncio.run(scenario())
        self.assertEqual(s.stop(timeout=30), 0)
        self.assertIn("second signal", s.log_text())


if __name__ == "__main__":
    harness.run_tests()
