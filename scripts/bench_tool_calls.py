#!/usr/bin/env python3
"""How many `auto` tool calls are valid calls: two corelm servers (or any OpenAI-compatible
ones) asked the same questions with the same seeds. A call is valid when its name is a tool's
and its arguments fit that tool's schema (checked here for the keywords the tools below use).

  python3 scripts/bench_tool_calls.py --url http://127.0.0.1:8391 [--url ...] [--seeds 10]
"""
import argparse, json, re, urllib.request

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather at an airport",
        "parameters": {"type": "object", "properties": {"airport": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA code"},
                                                        "unit": {"enum": ["C", "F"]}}, "required": ["airport", "unit"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z_]+$", "description": "IANA zone"}},
                       "required": ["zone"]}}},
    {"type": "function", "function": {"name": "book_table", "description": "Book a restaurant table",
        "parameters": {"type": "object", "properties": {"restaurant": {"type": "string", "maxLength": 30}, "people": {"type": "integer", "minimum": 1, "maximum": 12},
                                                        "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}}, "required": ["restaurant", "people", "time"]}}},
]
QUESTIONS = [
    "What's the weather at Oslo airport?",
    "What time is it in Tokyo right now?",
    "Book a table for four at Luigi's at half past seven tonight.",
    "Is it raining at JFK? Use Fahrenheit.",
    "Reserve Chez Marie for 2 people at 20:00.",
]


def fits(schema, v):
    t = schema.get("type")
    if "enum" in schema and v not in schema["enum"]:
        return False
    if t == "object":
        return isinstance(v, dict) and all(k in v for k in schema.get("required", [])) and all(
            k in schema["properties"] and fits(schema["properties"][k], x) for k, x in v.items())
    if t == "string":
        return isinstance(v, str) and len(v) <= schema.get("maxLength", 1 << 30) and (
            "pattern" not in schema or re.search(schema["pattern"], v) is not None)
    if t == "integer":
        return isinstance(v, int) and schema.get("minimum", -1 << 62) <= v <= schema.get("maximum", 1 << 62)
    return True


def ask(url, q, seed, temp):
    body = {"messages": [{"role": "user", "content": q}], "tools": TOOLS, "temperature": temp, "seed": seed, "max_tokens": 120}
    r = urllib.request.urlopen(urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}))
    m = json.loads(r.read())["choices"][0]["message"]
    return m.get("tool_calls") or [], m.get("content")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", action="append", required=True)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--temperature", type=float, default=0.7)
    a = ap.parse_args()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for url in a.url:
        answers = calls = valid = 0
        for q in QUESTIONS:
            for seed in range(a.seeds):
                got, _ = ask(url, q, seed, a.temperature)
                answers += 1
                calls += bool(got)
                valid += bool(got) and all(c["function"]["name"] in schemas and fits(schemas[c["function"]["name"]], json.loads(c["function"]["arguments"])) for c in got)
        print(f"{url}: {answers} answers, {calls} with calls, {valid} with every call valid ({valid / answers:.0%})")


if __name__ == "__main__":
    main()
