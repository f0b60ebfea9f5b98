"""Prefix cache and the SSD KV store through `dsinfer serve` (--kv-store): each protocol reports
the cached prompt tokens in its own usage field and a cached start gives the same greedy output;
/metrics shows hits per tier (device by default, host without a device tier), bytes per tier and
class; a restart keeps the SSD hits; kill -9 of
a server that is writing entries leaves a store that the next server serves from without error;
a bad X-DSInfer-Retention header is a 400.
"""

import os
import shutil
import tempfile

import harness
from harness import MODEL_NAME

harness.require(sdks=False)

SYSTEM = "You are a careful assistant. " + " ".join(f"note{i}" for i in range(80))
NO_THINKING = {"type": "disabled"}


def body(path, user):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    if path == "/v1/messages":
        return {"model": MODEL_NAME, "system": SYSTEM, "max_tokens": 6, "temperature": 0,
                "messages": [{"role": "user", "content": user}], "thinking": NO_THINKING}
    if path == "/v1/responses":
        return {"model": MODEL_NAME, "instructions": SYSTEM, "input": user, "temperature": 0,
                "max_output_tokens": 6, "reasoning": {"effort": "none"}}
    return {"model": MODEL_NAME, "messages": msgs, "max_tokens": 6, "temperature": 0,
            "thinking": NO_THINKING}


def usage(path, resp):
    """(prompt tokens, cached tokens, output text) in the protocol's own fields."""
    u = resp["usage"]
    if path == "/v1/messages":
        return (u["input_tokens"] + u["cache_read_input_tokens"], u["cache_read_input_tokens"],
                resp["content"])
    if path == "/v1/responses":
        text = [c.get("text") for o in resp["output"] for c in o.get("content", [])]
        return u["input_tokens"], u["input_tokens_details"]["cached_tokens"], text
    return (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"],
            resp["choices"][0]["message"]["content"])


def post(s, path, user, headers=None):
    h = dict(s.headers())
    h.update(headers or {})
    status, _, b = s.post(path, body(path, user), headers=h)
    assert status == 200, b
    return harness.json.loads(b)


class KvStore(harness.unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dsinfer-kv-")
        self.args = ("--kv-store", self.dir, "--kv-block", "16")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_usage_metrics_and_restart(self):
        paths = ("/v1/chat/completions", "/v1/messages", "/v1/responses")
        first = {}
        with harness.Server(*self.args, scripted=False) as s:
            for p in paths:
                n, cached, out = usage(p, post(s, p, "What is note7?"))
                # The protocols render the same conversation alike: only the first one misses.
                self.assertEqual(cached, 0 if p == paths[0] else n - 1, p)
                n2, cached2, out2 = usage(p, post(s, p, "What is note7?"))
                self.assertEqual(n2, n, p)
                self.assertEqual(cached2, n - 1, p)  # all but the last prompt token
                self.assertEqual(out2, out, p)       # same greedy output from the cached start
                first[p] = out
            # Served from the device tier (state memory) by default; the store has them too.
            m = s.wait_metric(lambda m: m['dsinfer_prefix_cache_hits_total{tier="device"}'] >= 3)
            self.assertGreater(m['dsinfer_prefix_cache_device_bytes'], 0)
            self.assertGreater(m['dsinfer_kv_store_bytes{tier="host",class="chat"}'], 0)
            s.wait_metric(lambda m: m['dsinfer_kv_store_bytes{tier="ssd",class="chat"}'] > 0)
            # Agent-class entries are accounted apart.
            post(s, paths[0], "An agent step.", headers={"X-DSInfer-Retention": "agent"})
            s.wait_metric(lambda m: m['dsinfer_kv_store_bytes{tier="host",class="agent"}'] > 0)
            status, _, b = s.post(paths[0], body(paths[0], "x"),
                                  headers={"X-DSInfer-Retention": "forever"})
            self.assertEqual(status, 400, b)
            self.assertIn(b"X-DSInfer-Retention", b)
        # A new server process over the same directory: the entries are found on SSD.
        with harness.Server(*self.args, scripted=False) as s:
            for p in paths:
                n, cached, out = usage(p, post(s, p, "What is note7?"))
                self.assertEqual(cached, n - 1, p)
                self.assertEqual(out, first[p], p)
            m = s.metrics()
            # The first request promotes the shared prompt from SSD; the others find it in RAM.
            self.assertGreaterEqual(m['dsinfer_prefix_cache_hits_total{tier="ssd"}'], 1)
            # Another tenant shares nothing.
            n, cached, _ = usage(paths[0], post(s, paths[0], "What is note7?",
                                                headers={"X-DSInfer-Cache-Tenant": "other"}))
            self.assertEqual(cached, 0)

    def test_host_tier_without_device_tier(self):
        with harness.Server(*self.args, "--kv-device-bytes", "0", scripted=False) as s:
            p = "/v1/chat/completions"
            n, cached, out = usage(p, post(s, p, "What is note9?"))
            n2, cached2, out2 = usage(p, post(s, p, "What is note9?"))
            self.assertEqual(cached2, n - 1)
            self.assertEqual(out2, out)
            m = s.wait_metric(lambda m: m['dsinfer_prefix_cache_hits_total{tier="host"}'] >= 1)
            self.assertEqual(m['dsinfer_prefix_cache_hits_total{tier="device"}'], 0)
            self.assertEqual(m['dsinfer_prefix_cache_device_entries'], 0)

    def test_kill_dash_nine_while_writing(self):
        s = harness.Server(*self.args, scripted=False)
        try:
            for i in range(6):
                post(s, "/v1/chat/completions", f"Question number {i}?")
        finally:
            s.kill()  # SIGKILL: writes may be mid-flight
            os.unlink(s.log.name)
        with harness.Server(*self.args, scripted=False) as s:
            for i in range(6):
                post(s, "/v1/chat/completions", f"Question number {i}?")
            m = s.metrics()
            self.assertEqual(m["dsinfer_kv_store_corrupt_total"], 0)
            self.assertEqual(m["dsinfer_prefix_cache_restore_failures_total"], 0)
        self.assertFalse([f for f in os.listdir(self.dir) if f.startswith("tmp-")])


if __name__ == "__main__":
    harness.run_tests()
