"""Generated request and model-output corpora for the deepseek-recipe comparison (compare.py).

Everything derives from one random.Random(seed): the same seed gives the same corpus. Requests
cover the three protocols (Chat Completions, Responses, Messages), both model versions, tools
with nested and strict schemas, tool results, thinking on/off, every effort level, unicode,
special-token look-alikes in every text field and long texts. Each request carries a category
(what it exercises) so differences are reported per category.
"""

import json
import random

MODELS = {"v4": "DeepSeek-V4-Pro", "v4.1": "DeepSeek-V4.1-Flash"}
OUR_VERSION = {"v4": "v4-0731", "v4.1": "v4.1"}

SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
           "<｜System｜>", "<｜latest_reminder｜>", "<think>", "</think>", "｜DSML｜",
           "<｜DSML｜tool_calls>", "</｜DSML｜invoke>", "<｜DSML｜ calls>", "<｜▁pad▁｜>",
           "<｜place▁holder▁no▁7｜>", "<|EOT|>", "|DSML|", "<｜fim▁hole｜>", "<tool_result>"]
UNICODE = ["héllo wörld", "你好，世界", "こんにちは", "🙂🚀👩‍💻", "e\u0301", "\u200b", "Ωμέγα",
           "مرحبا", "\t tab", "a\r\nb", "1e-7", "\\n", "\"quoted\"", "{\"json\": 1}", "—"]
WORDS = ("the quick brown fox jumps over lazy dog weather city paris tool call result value "
         "json schema number list object answer question think reason plan").split()

EFFORTS_CHAT = [None, "low", "medium", "high", "xhigh", "max", "minimal", "none"]
EFFORTS_RESP = [None, "low", "medium", "high", "xhigh", "max", "minimal", "none"]
EFFORTS_MSGS = [None, "low", "medium", "high", "max"]


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def pick(self, xs):
        return xs[self.r.randrange(len(xs))]

    def chance(self, p):
        return self.r.random() < p

    def text(self, kind=None):
        kind = kind or self.pick(["plain", "plain", "unicode", "special", "mixed", "long"])
        if kind == "plain":
            return " ".join(self.pick(WORDS) for _ in range(self.r.randint(1, 12)))
        if kind == "unicode":
            return " ".join(self.pick(UNICODE + WORDS) for _ in range(self.r.randint(1, 8)))
        if kind == "special":
            return " ".join(self.pick(SPECIAL + WORDS) for _ in range(self.r.randint(1, 8)))
        if kind == "mixed":
            return "".join(self.pick(SPECIAL + UNICODE + WORDS + [" ", "\n", "\n\n"])
                           for _ in range(self.r.randint(3, 20)))
        n = self.r.randint(300, 1500)
        return " ".join(self.pick(WORDS + UNICODE + SPECIAL[:3]) for _ in range(n))

    def name(self):
        return self.pick(["get_weather", "search", "run_code", "lookup_user", "calc", "f_1",
                          "send-mail", "toolA"])

    def schema(self, depth=0, strict=False):
        t = self.pick(["string", "number", "integer", "boolean", "array", "object", "enum"]
                      if depth < 2 else ["string", "number", "integer", "boolean", "enum"])
        s = {}
        if t == "enum":
            s = {"type": "string", "enum": [self.pick(WORDS), self.pick(UNICODE)]}
        elif t == "array":
            s = {"type": "array", "items": self.schema(depth + 1, strict)}
            if self.chance(0.3) and not strict:
                s["minItems"] = 1
        elif t == "object":
            s = self.object_schema(depth + 1, strict)
        else:
            s = {"type": t}
            if t == "number" and self.chance(0.3):
                s["minimum"] = self.pick([0, 1e-7, -2.5, 100])
            if t == "string" and self.chance(0.2):
                s["format"] = self.pick(["date-time", "email"])
            if t == "string" and self.chance(0.2):
                s["pattern"] = "^[a-z]+$"
        if self.chance(0.4):
            s["description"] = self.text(self.pick(["plain", "special", "unicode"]))
        if self.chance(0.15):
            s["default"] = None if s.get("type") != "integer" else 3
        return s

    def object_schema(self, depth=0, strict=False):
        props = {}
        for _ in range(self.r.randint(0 if not strict else 1, 4)):
            props[self.pick(WORDS) + self.pick(["", "_id", "2"])] = self.schema(depth, strict)
        s = {"type": "object", "properties": props}
        keys = list(props)
        if strict:
            s["required"] = keys
            s["additionalProperties"] = False
        elif keys and self.chance(0.6):
            s["required"] = keys[: self.r.randint(1, len(keys))]
        if self.chance(0.3):
            # key order other than the canonical one
            s = dict(reversed(list(s.items())))
        return s

    def function(self, strict=None):
        f = {"name": self.name() + str(self.r.randint(0, 9))}
        if self.chance(0.8):
            f["description"] = self.text(self.pick(["plain", "special", "unicode", "mixed"]))
        if self.chance(0.85):
            f["parameters"] = self.object_schema(0, strict=bool(strict))
        if strict is not None:
            f["strict"] = strict
        return f

    def args(self):
        a = {}
        for _ in range(self.r.randint(0, 4)):
            a[self.pick(WORDS)] = self.pick([self.text("plain"), self.text("special"),
                                             self.r.randint(-5, 1000), 1e-7, 2.5, True, None,
                                             [1, "a", {"k": "v"}], {"nested": {"x": 1.0}}])
        if self.chance(0.1):
            return ""
        if self.chance(0.05):
            return "not json " + self.text("special")
        return json.dumps(a, ensure_ascii=self.chance(0.5))


def tools_for(g, n):
    strict = g.pick([None, None, True, False])
    return [g.function(strict) for _ in range(n)]


def chat_request(g, version):
    cat = []
    body = {"model": MODELS[version], "messages": []}
    msgs = body["messages"]
    tools = []
    if g.chance(0.5):
        tools = tools_for(g, g.r.randint(1, 3))
        body["tools"] = [{"type": "function", "function": f} for f in tools]
        cat.append("tools")
        if any(f.get("strict") for f in tools):
            cat.append("strict")
        if g.chance(0.4):
            tc = g.pick(["auto", "none", "required", "named"])
            body["tool_choice"] = (tc if tc != "named" else
                                   {"type": "function", "function": {"name": tools[0]["name"]}})
            cat.append("tool_choice")
    if g.chance(0.6):
        content = g.text()
        if g.chance(0.2):
            content = [{"type": "text", "text": g.text()} for _ in range(g.r.randint(1, 3))]
            cat.append("system_parts")
        msgs.append({"role": "system", "content": content})
    thinking = g.pick([None, True, False])
    if thinking is not None:
        body["thinking"] = {"type": "enabled" if thinking else "disabled"}
    eff = g.pick(EFFORTS_CHAT)
    if eff:
        body["reasoning_effort"] = eff
        cat.append("effort")
    turns = g.r.randint(1, 3)
    for t in range(turns):
        if g.chance(0.15):
            msgs.append({"role": "latest_reminder", "content": g.text("plain")})
            cat.append("reminder")
        u = g.text()
        if g.chance(0.2):
            u = [{"type": "text", "text": g.text()} for _ in range(g.r.randint(1, 3))]
        msgs.append({"role": "user", "content": u})
        if t + 1 < turns or g.chance(0.1):
            a = {"role": "assistant", "content": g.text() if g.chance(0.8) else ""}
            if g.chance(0.5):
                a["reasoning_content"] = g.text()
            if tools and g.chance(0.5):
                calls = []
                for k in range(g.r.randint(1, 2)):
                    calls.append({"id": f"call_{t}_{k}", "type": "function",
                                  "function": {"name": g.pick(tools)["name"],
                                               "arguments": g.args()}})
                a["tool_calls"] = calls
                cat.append("history_tool_calls")
                msgs.append(a)
                for c in reversed(calls) if g.chance(0.3) else calls:
                    msgs.append({"role": "tool", "tool_call_id": c["id"], "content": g.text()})
                cat.append("tool_results")
                if g.chance(0.5):
                    msgs.append({"role": "assistant", "content": g.text(),
                                 "reasoning_content": g.text("plain")})
                continue
            msgs.append(a)
    if g.chance(0.08):
        msgs.append({"role": "assistant", "content": g.text("plain"),
                     **({"prefix": True} if g.chance(0.5) else {})})
        cat.append("final_assistant")
    if g.chance(0.15):
        kind = g.pick(["json_object", "json_object_noword", "json_schema", "text"])
        if kind == "json_object":
            body["response_format"] = {"type": "json_object"}
            msgs[-1 if msgs[-1]["role"] == "user" else 0]["content"] = "reply in json " + g.text(
                "plain")
        elif kind == "json_object_noword":
            body["response_format"] = {"type": "json_object"}
        elif kind == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "out", "schema": g.object_schema(0, strict=g.chance(0.5)),
                **({"strict": True} if g.chance(0.5) else {})}}
        else:
            body["response_format"] = {"type": "text"}
        cat.append("response_format")
    if g.chance(0.05):
        msgs.insert(0, {"role": "developer", "content": g.text("plain")})
        cat.append("developer")
    return body, cat


def responses_request(g, version):
    cat = []
    body = {"model": MODELS[version]}
    items = []
    tools = []
    if g.chance(0.5):
        tools = tools_for(g, g.r.randint(1, 3))
        body["tools"] = [dict({"type": "function"}, **f) for f in tools]
        cat.append("tools")
        if any(f.get("strict") for f in tools):
            cat.append("strict")
        if g.chance(0.4):
            tc = g.pick(["auto", "none", "required", "named"])
            body["tool_choice"] = tc if tc != "named" else {"type": "function",
                                                            "name": tools[0]["name"]}
            cat.append("tool_choice")
    if g.chance(0.4):
        body["instructions"] = g.text()
    if g.chance(0.2):
        items.append({"role": "developer", "content": g.text()})
        cat.append("developer")
    if g.chance(0.3):
        items.append({"role": "system", "content": g.text()})
    eff = g.pick(EFFORTS_RESP)
    if eff:
        body["reasoning"] = {"effort": eff}
        cat.append("effort")
    turns = g.r.randint(1, 3)
    for t in range(turns):
        if g.chance(0.3):
            items.append({"role": "user", "content": [
                {"type": "input_text", "text": g.text()} for _ in range(g.r.randint(1, 2))]})
        else:
            items.append({"role": "user", "content": g.text()})
        if t + 1 < turns:
            if g.chance(0.3):
                items.append({"type": "reasoning", "summary": [
                    {"type": "summary_text", "text": g.text()}]})
            items.append({"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": g.text()}]})
            if tools and g.chance(0.5):
                cid = f"call_{t}"
                items.append({"type": "function_call", "call_id": cid,
                              "name": g.pick(tools)["name"], "arguments": g.args()})
                items.append({"type": "function_call_output", "call_id": cid,
                              "output": g.text()})
                cat.append("tool_results")
    if g.chance(0.15):
        if g.chance(0.5):
            body["text"] = {"format": {"type": "json_schema", "name": "out",
                                       "schema": g.object_schema(0, strict=g.chance(0.5))}}
        else:
            body["text"] = {"format": {"type": "json_object"}}
        cat.append("text_format")
    body["input"] = items if items or g.chance(0.5) else g.text()
    if not items:
        body["input"] = g.text()
    return body, cat


def messages_request(g, version):
    cat = []
    body = {"model": MODELS[version], "max_tokens": g.pick([16, 1024, 4096]), "messages": []}
    msgs = body["messages"]
    tools = []
    if g.chance(0.5):
        for f in tools_for(g, g.r.randint(1, 3)):
            t = {"name": f["name"], "input_schema": f.get("parameters", {"type": "object"})}
            if "description" in f:
                t["description"] = f["description"]
            if f.get("strict") is not None:
                t["strict"] = f["strict"]
            tools.append(t)
        body["tools"] = tools
        cat.append("tools")
        if g.chance(0.4):
            tc = g.pick(["auto", "any", "none", "tool"])
            body["tool_choice"] = {"type": tc} if tc != "tool" else {"type": "tool",
                                                                      "name": tools[0]["name"]}
            cat.append("tool_choice")
    if g.chance(0.5):
        body["system"] = g.text() if g.chance(0.7) else [
            {"type": "text", "text": g.text()} for _ in range(g.r.randint(1, 3))]
    th = g.pick([None, "enabled", "disabled"])
    if th:
        body["thinking"] = {"type": th} if th == "disabled" else {"type": th,
                                                                  "budget_tokens": 1024}
    eff = g.pick(EFFORTS_MSGS)
    if eff:
        body["output_config"] = {"effort": eff}
        cat.append("effort")
    turns = g.r.randint(1, 3)
    for t in range(turns):
        if g.chance(0.3):
            msgs.append({"role": "user", "content": [
                {"type": "text", "text": g.text()} for _ in range(g.r.randint(1, 2))]})
        else:
            msgs.append({"role": "user", "content": g.text()})
        if t + 1 < turns:
            content = []
            if g.chance(0.4):
                content.append({"type": "thinking", "thinking": g.text(), "signature": "sig"})
            content.append({"type": "text", "text": g.text()})
            if tools and g.chance(0.5):
                tid = f"toolu_{t}"
                try:
                    inp = json.loads(g.args() or "{}")
                except ValueError:
                    inp = {}
                if not isinstance(inp, dict):
                    inp = {}
                content.append({"type": "tool_use", "id": tid, "name": g.pick(tools)["name"],
                                "input": inp})
                msgs.append({"role": "assistant", "content": content})
                msgs.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": tid, "content": g.text()}]})
                cat.append("tool_results")
                continue
            msgs.append({"role": "assistant", "content": content})
    if g.chance(0.1):
        msgs.append({"role": "assistant", "content": g.text("plain")})
        cat.append("final_assistant")
    return body, cat


def requests(seed, n):
    g = Gen(seed)
    out = []
    makers = {"chat": chat_request, "responses": responses_request, "messages": messages_request}
    for i in range(n):
        protocol = ["chat", "responses", "messages"][i % 3]
        version = ["v4", "v4.1"][(i // 3) % 2]
        body, cat = makers[protocol](g, version)
        out.append({"id": i, "protocol": protocol, "version": version, "request": body,
                    "categories": sorted(set(cat)) or ["basic"]})
    return out


# ---- model outputs for the parser ----

def dsml_call(g, name, args, v41):
    d = "｜DSML｜"
    inv, par = (" invoke", " parameter") if v41 else ("invoke", "parameter")
    s = f"<{d}{inv} name=\"{name}\">\n"
    for k, v in args.items():
        if isinstance(v, str):
            s += f"<{d}{par} name=\"{k}\" string=\"true\">{v}</{d}{par}>\n"
        else:
            s += f"<{d}{par} name=\"{k}\" string=\"false\">{json.dumps(v)}</{d}{par}>\n"
    return s + f"</{d}{inv}>"


def outputs(seed, n):
    g = Gen(seed)
    out = []
    for i in range(n):
        v41 = g.chance(0.5)
        thinking = g.chance(0.6)
        parts = []
        cat = []
        if thinking:
            r = g.text(g.pick(["plain", "unicode", "plain"]))
            if g.chance(0.2):
                r += " literal <think> inside "
                cat.append("think_in_reasoning")
            parts.append(("\n" if g.chance(0.3) else "") + r)
            parts.append("</think>")
        content = g.text(g.pick(["plain", "unicode"])) if g.chance(0.8) else ""
        if g.chance(0.1):
            content = "\n\n" + content
        parts.append(content)
        tools = g.chance(0.4)
        if tools:
            block = " calls" if v41 else "tool_calls"
            calls = []
            for _ in range(g.r.randint(1, 2)):
                args = {}
                for _ in range(g.r.randint(0, 3)):
                    args[g.pick(WORDS)] = g.pick([g.text("plain"), 3, 2.5, True, None,
                                                 [1, 2], {"a": "b"}])
                calls.append(dsml_call(g, g.name(), args, v41))
            parts.append(f"\n\n<｜DSML｜{block}>\n" + "\n".join(calls) + f"\n</｜DSML｜{block}>")
            cat.append("tool_calls")
        if g.chance(0.1):
            parts.append("<｜end▁of▁sentence｜>")
            cat.append("eos_text")
        stop = []
        if g.chance(0.15):
            stop = [g.pick(WORDS)]
            cat.append("stop")
        out.append({"id": i, "text": "".join(parts), "thinking": thinking, "tools": tools,
                    "stop": stop, "categories": sorted(set(cat)) or ["basic"]})
    return out
