"""The JSON-schema corpus of the structured-output tests (test_structured_outputs.py): 50 schemas
covering nested objects, arrays, enums, anyOf, required fields, numeric bounds, patterns and string
formats. Each output the server produces under one of them must validate against it."""


def _obj(props, required=None, **kw):
    s = {"type": "object", "properties": props,
         "required": list(props) if required is None else required}
    s.update(kw)
    return s


S = {"type": "string", "maxLength": 24}
I = {"type": "integer", "minimum": 0, "maximum": 1000}
B = {"type": "boolean"}
N = {"type": "number", "minimum": -100, "maximum": 100}

SCHEMAS = [
    # Flat objects.
    _obj({"name": S}),
    _obj({"name": S, "age": I}),
    _obj({"ok": B}),
    _obj({"x": N, "y": N}),
    _obj({"id": I, "label": S, "active": B}),
    _obj({"title": S, "year": {"type": "integer", "minimum": 1900, "maximum": 2100}}),
    _obj({"count": {"type": "integer"}}),
    _obj({"price": {"type": "number"}, "currency": {"enum": ["USD", "EUR", "JPY"]}}),
    _obj({"a": S, "b": S, "c": S}, required=["a"]),
    _obj({"flag": B, "note": S}, required=["flag"]),
    # Enums and consts.
    _obj({"color": {"enum": ["red", "green", "blue"]}}),
    _obj({"level": {"enum": [1, 2, 3]}}),
    _obj({"status": {"enum": ["ok", "error"]}, "code": I}),
    _obj({"kind": {"const": "point"}, "x": I, "y": I}),
    _obj({"answer": {"enum": ["yes", "no", "maybe"]}, "confidence": N}),
    # Arrays.
    _obj({"tags": {"type": "array", "items": S, "maxItems": 4}}),
    _obj({"numbers": {"type": "array", "items": I, "minItems": 1, "maxItems": 5}}),
    _obj({"flags": {"type": "array", "items": B, "maxItems": 3}}),
    _obj({"matrix": {"type": "array", "maxItems": 3,
                     "items": {"type": "array", "items": I, "maxItems": 3}}}),
    _obj({"colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                     "minItems": 1, "maxItems": 3}}),
    {"type": "array", "items": I, "minItems": 1, "maxItems": 4},
    {"type": "array", "items": _obj({"k": S, "v": I}), "maxItems": 3},
    _obj({"pairs": {"type": "array", "maxItems": 3,
                    "items": {"type": "array", "prefixItems": [S, I], "items": False}}}),
    # Nested objects.
    _obj({"user": _obj({"name": S, "age": I})}),
    _obj({"point": _obj({"x": N, "y": N}), "label": S}),
    _obj({"a": _obj({"b": _obj({"c": _obj({"d": I})})})}),
    _obj({"order": _obj({"id": I, "items": {"type": "array", "maxItems": 3,
                                            "items": _obj({"sku": S, "qty": I})}})}),
    _obj({"person": _obj({"name": S, "address": _obj({"city": S, "zip": {
        "type": "string", "pattern": "^[0-9]{5}$"}})})}),
    _obj({"config": _obj({"debug": B, "level": {"enum": ["low", "high"]},
                          "retries": {"type": "integer", "minimum": 0, "maximum": 9}})}),
    _obj({"meta": _obj({"version": S}, required=[]), "data": {"type": "array", "items": I,
                                                              "maxItems": 3}}),
    # anyOf / oneOf / nullable.
    _obj({"value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 10}]}}),
    _obj({"value": {"anyOf": [B, {"type": "null"}]}}),
    _obj({"shape": {"anyOf": [_obj({"circle": N}), _obj({"square": N})]}}),
    {"anyOf": [_obj({"ok": {"const": True}, "result": I}),
               _obj({"ok": {"const": False}, "error": S})]},
    _obj({"id": {"anyOf": [I, S]}, "note": {"anyOf": [S, {"type": "null"}]}}),
    _obj({"item": {"oneOf": [_obj({"kind": {"const": "a"}, "a": I}),
                             _obj({"kind": {"const": "b"}, "b": B})]}}),
    # Required subsets / optional fields / additionalProperties false.
    _obj({"first": S, "last": S, "middle": S}, required=["first", "last"]),
    _obj({"x": I, "y": I, "z": I}, required=["x"], additionalProperties=False),
    _obj({"name": S, "email": {"type": "string", "format": "email"}}, required=["name"]),
    _obj({"k": S}, required=[], additionalProperties=False),
    # Numbers with bounds.
    _obj({"percent": {"type": "number", "minimum": 0, "maximum": 100}}),
    _obj({"temp": {"type": "integer", "minimum": -50, "maximum": 50}}),
    _obj({"score": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}}),
    # String formats and patterns.
    _obj({"email": {"type": "string", "format": "email"}}),
    _obj({"date": {"type": "string", "format": "date"}}),
    _obj({"id": {"type": "string", "format": "uuid"}}),
    _obj({"ip": {"type": "string", "format": "ipv4"}}),
    _obj({"ip6": {"type": "string", "format": "ipv6"}}),
    _obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}),
    _obj({"user": _obj({"email": {"type": "string", "format": "email"},
                        "born": {"type": "string", "format": "date"},
                        "roles": {"type": "array", "items": {"enum": ["admin", "user"]},
                                  "maxItems": 2}})}),
]

assert len(SCHEMAS) >= 50, len(SCHEMAS)

# Every schema's output must finish within the test's max_tokens (400) and validate. (Three of them
# have an `email` with no length bound; the model used to write the address's domain part until the
# budget ended. The grammar now bounds email addresses to RFC 5321/1035's limits, src/grammar.)
