"""The official `openai` Python client against `corelm serve`, unchanged: chat (streaming and
not, JSON mode, structured outputs from pydantic models), text completions, models, the
Responses API (text, streamed, function calls), and errors surfacing as the client's
exception types.

Run by scripts/test_openai_client.sh (which installs `openai` in a venv and starts the server);
CORELM_BASE_URL and CORELM_MODEL_ID say where the server is and what it serves.
"""

import json
import struct

import openai
import checks
from checks import BASE, MODEL, check

client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=120)

models = client.models.list()
check("models.list names the model", [m.id for m in models.data] == [MODEL], models)
check("models.retrieve finds it", client.models.retrieve(MODEL).id == MODEL)

messages = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]
r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0, seed=1)
text = r.choices[0].message.content
check("chat: assistant message", r.choices[0].message.role == "assistant" and len(text) > 0, r)
check("chat: mentions Paris", "Paris" in text, text)
check("chat: finish_reason", r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason)
check("chat: usage adds up", r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)

stream = client.chat.completions.create(
    model=MODEL, messages=messages, max_tokens=24, temperature=0, seed=1, stream=True,
    stream_options={"include_usage": True},
)
pieces, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            pieces.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
check("stream: same text as non-streaming", "".join(pieces) == text, ("".join(pieces), text))
check("stream: finish_reason", finish == r.choices[0].finish_reason, finish)
check("stream: usage chunk", usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage)

# n choices: indices 0..n in order, each streamed choice gathered by its index.
r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=1.0, seed=3, n=3)
texts = [c.message.content for c in r.choices]
check("chat n=3: three choices in order", [c.index for c in r.choices] == [0, 1, 2] and all(texts), r)
stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=1.0, seed=3, n=3, stream=True)
gathered = ["", "", ""]
for chunk in stream:
    for c in chunk.choices:
        gathered[c.index] += c.delta.content or ""
check("chat n=3 streamed: each choice's text", gathered == texts, (gathered, texts))
r = client.completions.create(model=MODEL, prompt=["The capital of France is", "One, two,"], max_tokens=2, temperature=0, n=2)
check("completions: two prompts x n=2", len(r.choices) == 4 and r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text, r)

r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
lp = r.choices[0].logprobs.content
check("chat logprobs", len(lp) == 3 and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in lp), lp)

# echo with logprobs, as lm-evaluation-harness scores a continuation: token lists in, the
# continuation's scores read from token_logprobs[ctxlen:-1].
ctx, cont = [504, 3575, 282, 4649, 314], [7042, 30]
r = client.completions.create(model=MODEL, prompt=[ctx + cont], max_tokens=1, temperature=0, logprobs=1, echo=True)
lp = r.choices[0].logprobs
check("completions: echo scores the prompt", len(lp.token_logprobs) == len(ctx + cont) + 1 and lp.token_logprobs[0] is None
      and all(x <= 0 for x in lp.token_logprobs[1:]) and r.choices[0].text.startswith("The capital of France is Paris."), (r.choices[0].text, lp))
r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=0, logprobs=0, echo=True)
check("completions: echo with max_tokens 0", r.choices[0].text == "The capital of France is" and r.usage.completion_tokens == 0, r)

r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0, stop=["\n"])
check("completions: text", isinstance(r.choices[0].text, str) and "\n" not in r.choices[0].text, r)

# logit_bias: the greedy first token " Paris" (id 7042 in SmolLM2's vocabulary) banned.
first = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=1, temperature=0)
banned = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=1, temperature=0, logit_bias={"7042": -100})
check("completions: logit_bias bans a token", first.choices[0].text == " Paris" and banned.choices[0].text != " Paris", (first.choices[0].text, banned.choices[0].text))

r = client.chat.completions.create(
    model=MODEL, max_tokens=160, temperature=0, response_format={"type": "json_object"},
    messages=[{"role": "user", "content": "Give me a JSON object describing a cat with name and age."}],
)
try:
    obj = json.loads(r.choices[0].message.content)
except ValueError as e:
    obj = e
check("json_object: a JSON object, stopped where it closes",
      isinstance(obj, dict) and r.choices[0].finish_reason == "stop", (r.choices[0].message.content, obj))

# Structured outputs: the client turns a pydantic model into a strict JSON Schema
# (`response_format: {"type": "json_schema", ...}`, with `$defs`, `anyOf`, `enum`, string
# lengths, number bounds, a pattern and a date's format) and parses the answer back into the model,
# which checks them.
from datetime import date  # noqa: E402
from typing import Annotated, List, Literal, Optional, Union  # noqa: E402

from pydantic import BaseModel, Field  # noqa: E402


class Owner(BaseModel):
    first: str
    last: str


class Cat(BaseModel):
    name: str = Field(min_length=2, max_length=12)
    age: int = Field(ge=1, le=25)
    weight_kg: float = Field(gt=0, lt=15)
    colour: Literal["black", "white", "ginger", "grey"]
    indoor: bool
    toys: List[str] = Field(max_length=3)
    owner: Optional[Owner]
    chip: str = Field(pattern=r"^[A-F0-9]{4}-[0-9]{2}$")
    born: date


parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
r = parse(
    model=MODEL, max_tokens=240, temperature=0, response_format=Cat,
    messages=[{"role": "user", "content": "Describe a cat as JSON."}],
)
check("json_schema: parsed into the pydantic model, stopped where it closes",
      isinstance(r.choices[0].message.parsed, Cat) and r.choices[0].finish_reason == "stop",
      (r.choices[0].message.content, r.choices[0].finish_reason))

# Unions of objects: a discriminated one (pydantic writes `oneOf` and `discriminator`) in a list,
# and a plain one (`anyOf`); both alternatives start with `{"kind": "`.
class Walk(BaseModel):
    kind: Literal["walk"]
    km: float = Field(ge=0, le=50)


class Nap(BaseModel):
    kind: Literal["nap"]
    hours: int = Field(ge=0, le=20)


class Day(BaseModel):
    activities: List[Annotated[Union[Walk, Nap], Field(discriminator="kind")]] = Field(max_length=3)
    mood: Union[Walk, Nap]


r = parse(
    model=MODEL, max_tokens=200, temperature=0, response_format=Day,
    messages=[{"role": "user", "content": "Plan a lazy day as JSON."}],
)
check("json_schema: unions of objects parsed into the pydantic model",
      isinstance(r.choices[0].message.parsed, Day) and r.choices[0].finish_reason == "stop",
      (r.choices[0].message.content, r.choices[0].finish_reason))

# URLs, multiples and tuples, as pydantic writes them: `AnyUrl` is `format: uri` with a
# `minLength`, here with a `maxLength` too (`HttpUrl` has one of 2083), `multiple_of` is
# `multipleOf`, a `Tuple` is `prefixItems`.
from typing import Tuple  # noqa: E402

from pydantic import AnyUrl, UrlConstraints  # noqa: E402


class Site(BaseModel):
    name: str = Field(max_length=20)
    url: Annotated[AnyUrl, UrlConstraints(max_length=80)]
    visits: int = Field(multiple_of=5, ge=0, le=1000)
    top_page: Tuple[Annotated[str, Field(max_length=16)], int]


r = parse(
    model=MODEL, max_tokens=200, temperature=0, response_format=Site,
    messages=[{"role": "user", "content": "Give me a JSON object about the Wikipedia website."}],
)
site = r.choices[0].message.parsed
check("json_schema: a URL, a multipleOf and a tuple parsed into the pydantic model",
      isinstance(site, Site) and r.choices[0].finish_reason == "stop" and site.visits % 5 == 0
      and isinstance(site.top_page[1], int),
      (r.choices[0].message.content, r.choices[0].finish_reason))

# Tool calling: a forced call of a pydantic function tool, parsed back into the model by the
# client; the same streamed (deltas gathered as the client's users do); the call and its
# result sent back for the next turn.


class GetWeather(BaseModel):
    city: str = Field(max_length=20)
    unit: Literal["celsius", "fahrenheit"]


ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
weather_tool = openai.pydantic_function_tool(GetWeather, name="get_weather", description="Current weather in a city")
r = parse(model=MODEL, messages=ask, tools=[weather_tool], tool_choice="required", temperature=0, max_tokens=60)
c = r.choices[0]
call = (c.message.tool_calls or [None])[0]
check("tools: a forced call, parsed into the pydantic model",
      c.finish_reason == "tool_calls" and call is not None and call.function.name == "get_weather"
      and isinstance(call.function.parsed_arguments, GetWeather), c.message)
pieces, finish = {}, None
for ch in client.chat.completions.create(model=MODEL, messages=ask, tools=[weather_tool], tool_choice="required",
                                         temperature=0, max_tokens=60, stream=True):
    if not ch.choices:
        continue
    for d in ch.choices[0].delta.tool_calls or []:
        p = pieces.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
        p["id"] = d.id or p["id"]
        p["name"] += (d.function and d.function.name) or ""
        p["arguments"] += (d.function and d.function.arguments) or ""
    finish = ch.choices[0].finish_reason or finish
check("tools: streamed, the same call", finish == "tool_calls" and call is not None and len(pieces) == 1
      and pieces[0]["name"] == "get_weather" and json.loads(pieces[0]["arguments"]) == json.loads(call.function.arguments), pieces)
if call is not None:
    turn = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "sunny"})}]
    r = client.chat.completions.create(model=MODEL, messages=turn, tools=[weather_tool], tool_choice="none", temperature=0, max_tokens=30)
    check("tools: the result sent back, an answer in text", isinstance(r.choices[0].message.content, str)
          and not r.choices[0].message.tool_calls, r.choices[0].message)

# Embeddings: the client asks for base64 unless told otherwise; both forms give one vector.
texts = ["The cat sat on the mat.", "A kitten was sitting on the rug.", "Stock markets fell sharply on Tuesday."]
e64 = client.embeddings.create(model=MODEL, input=texts)
ef = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
vecs = [d.embedding for d in ef.data]
check("embeddings: one unit vector per input, in order", [d.index for d in ef.data] == [0, 1, 2]
      and all(len(v) == 576 and abs(sum(x * x for x in v) - 1) < 1e-4 for v in vecs), [len(v) for v in vecs])
as_f32 = lambda v: list(struct.unpack(f"{len(v)}f", struct.pack(f"{len(v)}f", *v)))
check("embeddings: base64 decodes to the float answer", [list(d.embedding) for d in e64.data] == [as_f32(v) for v in vecs])
cos = lambda a, b: sum(x * y for x, y in zip(a, b))
check("embeddings: the paraphrase is nearer than the other topic", cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2]),
      (cos(vecs[0], vecs[1]), cos(vecs[0], vecs[2])))
check("embeddings: usage counts the inputs' tokens", ef.usage.prompt_tokens == ef.usage.total_tokens > 3, ef.usage)
one = client.embeddings.create(model=MODEL, input=texts[1], encoding_format="float")
check("embeddings: a single input gives the same vector as in a list", one.data[0].embedding == vecs[1])
try:
    client.embeddings.create(model=MODEL, input=texts, dimensions=64)
    check("embeddings: other dimensions -> BadRequestError", False, "no error")
except openai.BadRequestError as e:
    check("embeddings: other dimensions -> BadRequestError naming dimensions", "dimensions" in str(e), e)

try:
    client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=3)
    check("unknown model -> NotFoundError", False, "no error")
except openai.NotFoundError as e:
    check("unknown model -> NotFoundError", e.status_code == 404)
# The server runs with `--alias MODEL,gpt-4o-mini`: the second name is taken too.
aliased = client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=3, temperature=0)
check("a model --alias is taken, answered as the first alias", aliased.model == MODEL and aliased.choices[0].message.content, aliased)
check("models.list gives the aliases", getattr(models.data[0], "aliases", None) == [MODEL, "gpt-4o-mini"], models)

try:
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10**6)
    check("too long -> BadRequestError", False, "no error")
except openai.BadRequestError as e:
    check("too long -> BadRequestError context_length_exceeded", e.code == "context_length_exceeded", e)

try:
    client.chat.completions.create(model=MODEL, messages=messages, temperature=5)
    check("bad field -> BadRequestError", False, "no error")
except openai.BadRequestError as e:
    check("bad field -> BadRequestError naming temperature", "temperature" in str(e), e)

try:
    client.completions.create(model=MODEL, prompt="def f(", suffix="):", max_tokens=4)
    check("suffix on a model without FIM tokens -> BadRequestError", False, "no error")
except openai.BadRequestError as e:
    check("suffix on a model without FIM tokens -> BadRequestError naming suffix", e.param == "suffix", e)

# The Responses API: text, streamed through the client's accumulator, a function call.
ask = dict(model=MODEL, instructions="You answer in one short sentence.", input="What is the capital of France?",
           max_output_tokens=40, temperature=0)
r = client.responses.create(**ask)
check("responses: output_text", "Paris" in r.output_text and r.status == "completed", r)
with client.responses.stream(**ask) as s:
    deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
    final = s.get_final_response()
check("responses stream: the same text in pieces", len(deltas) > 1 and "".join(deltas) == r.output_text == final.output_text, (deltas, final))
counted = client.responses.input_tokens.count(model=MODEL, instructions=ask["instructions"], input=ask["input"])
check("responses input_tokens: the prompt", counted.input_tokens == r.usage.input_tokens, (counted, r.usage))
weather = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False},
           "strict": True}
call_ask = dict(ask, input="What is the weather in Paris?", tools=[weather], tool_choice={"type": "function", "name": "get_weather"})
r = client.responses.create(**call_ask)
calls = [o for o in r.output if o.type == "function_call"]
check("responses: a function call", len(calls) == 1 and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments), r.output)
with client.responses.stream(**call_ask) as s:
    final = s.get_final_response()
streamed = [o for o in final.output if o.type == "function_call"]
check("responses stream: the call's arguments rebuilt", len(streamed) == 1 and json.loads(streamed[0].arguments) == json.loads(calls[0].arguments), final.output)
r = client.responses.create(**dict(call_ask, tool_choice="auto", input=[
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
    {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 24 °C."},
]))
check("responses: the call's output answered", len(r.output) > 0, r)
try:
    client.responses.create(**dict(ask, previous_response_id="resp_1"))
    check("previous_response_id -> BadRequestError", False, "no error")
except openai.BadRequestError as e:
    check("previous_response_id -> BadRequestError naming it", e.param == "previous_response_id", e)

checks.finish()
