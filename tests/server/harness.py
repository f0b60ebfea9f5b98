"""Test harness for `dsinfer serve`: starts the server on a free loopback port, waits for
/health, and stops it with SIGTERM (checking the exit code). Also a minimal raw HTTP/1.1 + SSE
client (blocking and asyncio) for the tests that need control over the socket.

Environment (set by ctest, see tests/unit/server/CMakeLists.txt):
  DSINFER_BIN                    the dsinfer binary (default: build/bin/dsinfer)
  DSINFER_SERVER_TEST_MODEL      the model directory to serve
  DSINFER_SERVER_FIXTURE_MODEL   the small fixture model (the default model)
Exit code 77 (ctest SKIP_RETURN_CODE) when the SDKs or the serve command are missing.
"""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPTED = os.path.join(HERE, "scripted_outputs.json")
MODEL_NAME = "test-model"
SKIP = 77


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


def dsinfer_bin():
    return os.environ.get("DSINFER_BIN") or os.path.join(ROOT, "build", "bin", "dsinfer")


def fixture_model_dir():
    return (os.environ.get("DSINFER_SERVER_FIXTURE_MODEL")
            or os.path.join(ROOT, "build", "server-test-model"))


def model_dir():
    return os.environ.get("DSINFER_SERVER_TEST_MODEL") or fixture_model_dir()


def require(sdks=True, model=None):
    """Skips the whole test file (exit 77) when something it needs is missing."""
    model = model or model_dir()
    b = dsinfer_bin()
    if not os.path.exists(b):
        skip(f"{b} does not exist")
    r = subprocess.run([b, "serve", "--help"], capture_output=True)
    if r.returncode != 0:
        skip(f"{b} has no `serve` command")
    if not os.path.exists(os.path.join(model, "config.json")):
        skip(f"no model at {model}")
    if sdks:
        try:
            import anthropic  # noqa: F401
            import openai  # noqa: F401
        except ImportError as e:
            skip(f"Python SDK missing ({e}); see scripts/deps.sh dsi_install_python_server_test_deps")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`dsinfer serve` in a subprocess. Use as a context manager or call stop()."""

    def __init__(self, *args, scripted=True, api_key=None, model=None, timeout=60):
        self.port = free_port()
        self.api_key = api_key
        cmd = [dsinfer_bin(), "serve", "--model", model or model_dir(), "--host", "127.0.0.1",
               "--port", str(self.port), "--served-model-name", MODEL_NAME,
               "--state-memory", "256MiB"]
        if scripted:
            cmd += ["--debug-scripted-output", SCRIPTED]
        if api_key:
            cmd += ["--api-key", api_key]
        cmd += list(args)
        self.log = tempfile.NamedTemporaryFile(prefix="dsinfer-serve-", suffix=".log", delete=False)
        env = dict(os.environ)
        env.pop("DSINFER_API_KEY", None)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.returncode = None
        self.terminated = False
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dsinfer serve exited with {self.proc.returncode}:\n"
                                   + self.log_text())
            try:
                if self.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.kill()
                raise RuntimeError("dsinfer serve did not become healthy:\n" + self.log_text())
            time.sleep(0.05)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def headers(self):
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def get(self, path, headers=None):
        return http_request("GET", self.url + path,
                            headers=headers if headers is not None else self.headers())

    def post(self, path, body, headers=None):
        h = {"Content-Type": "application/json"}
        h.update(headers if headers is not None else self.headers())
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return http_request("POST", self.url + path, data=data, headers=h)

    def metrics(self):
        """{'name{labels}': value} from /metrics."""
        status, _, text = self.get("/metrics")
        assert status == 200, text
        out = {}
        for line in text.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def wait_metric(self, pred, timeout=15):
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if pred(m):
                return m
            if time.time() > deadline:
                raise AssertionError("metrics condition not met; last:\n"
                                     + json.dumps({k: v for k, v in m.items() if "bucket" not in k},
                                                  indent=1))
            time.sleep(0.02)

    def log_text(self):
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")

    def terminate(self):
        """Sends SIGTERM (once)."""
        if not self.terminated:
            self.terminated = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout=90):
        """SIGTERM (unless already sent), then wait; returns the exit code."""
        if self.returncode is None:
            self.terminate()
            try:
                self.returncode = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        return self.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.returncode = self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        code = self.stop()
        log = self.log_text()
        os.unlink(self.log.name)
        if exc[0] is None:
            assert code == 0, f"dsinfer serve exited with {code}:\n{log[-4000:]}"
            check_log_has_no_text(log)
        return False


SECRET_WORDS = ("Hello! How can I help?", "get_weather", "[[answer]]", "Paris")


def check_log_has_no_text(log):
    """INFO logs carry sizes and timings only: no prompt or completion text."""
    for w in SECRET_WORDS:
        assert w not in log, f"server log contains request/response text {w!r}:\n{log[-2000:]}"


def http_request(method, url, data=None, headers=None, timeout=60):
    """(status, headers, body bytes); HTTP errors are returned, not raised."""
    if isinstance(data, str):
        data = data.encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def parse_sse(text):
    """[(event or None, data str)] from an SSE body."""
    frames = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        event, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        frames.append((event, "\n".join(data)))
    return frames


# ---- raw asyncio HTTP/1.1 client with chunked SSE decoding (load and lifecycle tests) ----

async def open_stream(port, path, body, headers=None):
    """Sends a POST; returns (reader, writer, status, headers dict)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    h = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json",
         "Content-Length": str(len(data)), "Connection": "close"}
    h.update(headers or {})
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    writer.write(head.encode() + data)
    await writer.drain()
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    resp_headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        k, v = line.decode().split(":", 1)
        resp_headers[k.strip().lower()] = v.strip()
    return reader, writer, status, resp_headers


async def read_chunk(reader):
    """One chunk of a chunked body (b"" for the last one)."""
    size = int((await reader.readline()).strip(), 16)
    if size == 0:
        await reader.readline()
        return b""
    chunk = await reader.readexactly(size)
    await reader.readexactly(2)
    return chunk


async def read_body(reader, headers, on_chunk=None):
    """The whole body (chunked or Content-Length or to EOF); on_chunk(bytes) per chunk."""
    body = b""
    if headers.get("transfer-encoding") == "chunked":
        while True:
            chunk = await read_chunk(reader)
            if not chunk:
                break
            body += chunk
            if on_chunk:
                on_chunk(chunk)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body = await reader.read()
    return body


def run_tests():
    unittest.main(verbosity=2)
