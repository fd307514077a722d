"""The official `anthropic` Python client against `corelm serve`'s Messages API, unchanged:
messages (whole and streamed through the client's own event accumulator), tool use (the
client rebuilds each call's input from its streamed JSON pieces), token counting, and errors
surfacing as the client's exception types.

Run by scripts/test_openai_client.sh (which installs `anthropic` beside `openai` and starts
the server); CORELM_BASE_URL (the server's `/v1` root) and CORELM_MODEL_ID say where the
server is and what it serves.
"""

import anthropic
import checks
from checks import BASE, MODEL, check

# The client adds `/v1/messages` itself.
client = anthropic.Anthropic(base_url=BASE.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=120)


ask = dict(
    model=MODEL, max_tokens=24, temperature=0, system="You answer in one short sentence.",
    messages=[{"role": "user", "content": "What is the capital of France?"}],
)
m = client.messages.create(**ask)
text = "".join(b.text for b in m.content if b.type == "text")
check("messages: a text block", m.role == "assistant" and [b.type for b in m.content] == ["text"], m)
check("messages: mentions Paris", "Paris" in text, text)
check("messages: stop_reason", m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason)
check("messages: usage", m.usage.output_tokens > 0 and m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 10, m.usage)

with client.messages.stream(**ask) as s:
    pieces = list(s.text_stream)
    final = s.get_final_message()
check("stream: text in pieces", len(pieces) > 1, pieces)
check("stream: the same text", "".join(pieces) == text, (pieces, text))
check("stream: the accumulated message", final.content[0].text == text and final.stop_reason == m.stop_reason, final)

counted = client.messages.count_tokens(model=MODEL, system=ask["system"], messages=ask["messages"])
check("count_tokens: the prompt", counted.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), (counted, m.usage))

stopped = client.messages.create(**ask, stop_sequences=["Paris"])
check("stop_sequences: stop_reason and the sequence", (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "Paris"), stopped)

weather = {
    "name": "get_weather", "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ask_tool = dict(ask, max_tokens=40, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                tools=[weather], tool_choice={"type": "tool", "name": "get_weather"})
m = client.messages.create(**ask_tool)
calls = [b for b in m.content if b.type == "tool_use"]
check("tool_use: one call of the tool", len(calls) == 1 and calls[0].name == "get_weather" and m.stop_reason == "tool_use", m)
check("tool_use: input an object of the schema", isinstance(calls[0].input, dict) and isinstance(calls[0].input.get("city"), str), calls[0].input)
with client.messages.stream(**ask_tool) as s:
    final = s.get_final_message()
streamed = [b for b in final.content if b.type == "tool_use"]
check("tool_use streamed: the input rebuilt from its pieces", len(streamed) == 1 and streamed[0].input == calls[0].input, final)

answer = client.messages.create(**dict(ask_tool, tool_choice={"type": "auto"}, messages=ask_tool["messages"] + [
    {"role": "assistant", "content": [{"type": "tool_use", "id": calls[0].id, "name": "get_weather", "input": calls[0].input}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "Sunny, 24 °C."}]},
]))
check("tool_result: answered", len(answer.content) > 0, answer)

try:
    client.messages.create(**dict(ask, model="claude-sonnet-4-5"))
    check("unknown model: NotFoundError", False, "no error")
except anthropic.NotFoundError as e:
    check("unknown model: NotFoundError", e.body["error"]["type"] == "not_found_error", e.body)
try:
    client.messages.create(**dict(ask, temperature=5))
    check("bad temperature: BadRequestError", False, "no error")
except anthropic.BadRequestError as e:
    check("bad temperature: BadRequestError", "temperature" in e.body["error"]["message"], e.body)

checks.finish()
