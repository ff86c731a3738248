"""The official Python SDKs against a live mlxkit server: what agents and apps actually send.

Usage: clients.py BASE_URL MODEL. Exits non-zero (with the failing assertion) on any mismatch.
"""
import json
import sys

import anthropic
import ollama
import openai

BASE, MODEL = sys.argv[1], sys.argv[2]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def check_anthropic():
    client = anthropic.Anthropic(base_url=BASE, api_key="unused")
    # This SDK no longer has a `temperature` argument; the server still reads the field.
    greedy = {"extra_body": {"temperature": 0}}
    reply = client.messages.create(
        model=MODEL, max_tokens=8, **greedy, system="You are terse.",
        messages=[{"role": "user", "content": "Say hi."}])
    assert reply.type == "message" and reply.stop_reason == "max_tokens", reply
    assert reply.usage.output_tokens == 8, reply.usage
    with client.messages.stream(
            model=MODEL, max_tokens=8, **greedy, system="You are terse.",
            messages=[{"role": "user", "content": "Say hi."}]) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == reply.content[0].text, (streamed, reply.content)
    assert final.stop_reason == "max_tokens"

    question = {"role": "user", "content": "What is the weather in Paris?"}
    call_reply = client.messages.create(
        model=MODEL, max_tokens=64, **greedy, tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        messages=[question])
    assert call_reply.stop_reason == "tool_use", call_reply
    call = next(b for b in call_reply.content if b.type == "tool_use")
    assert call.name == "get_weather" and isinstance(call.input["city"], str), call
    answer = client.messages.create(
        model=MODEL, max_tokens=16, **greedy, tools=[WEATHER],
        messages=[
            question,
            {"role": "assistant", "content": [b.model_dump() for b in call_reply.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "18C and sunny"},
                {"type": "text", "text": "<system-reminder>One line.</system-reminder>"},
            ]},
        ])
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use"), answer
    assert answer.usage.cache_read_input_tokens > 0, answer.usage
    count = client.messages.count_tokens(model=MODEL, messages=[question], tools=[WEATHER])
    assert count.input_tokens > 0
    try:
        client.messages.create(model="nosuch:1b", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("an unknown model was served")
    except anthropic.NotFoundError as e:
        assert e.body["error"]["type"] == "not_found_error", e.body
    # What Claude Code sends: a system message mid-conversation, adaptive thinking, context
    # management, cache control, a server tool (left out, with a warning header) and beta
    # headers.
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=8, system="You are terse.",
        thinking={"type": "adaptive"},
        tools=[{"type": "web_search_20250305", "name": "web_search"},
               {**WEATHER, "cache_control": {"type": "ephemeral"}}],
        extra_headers={"anthropic-beta": "mid-conversation-system-2026-04-07"},
        extra_body={"temperature": 0, "context_management": {"edits": []},
                    "output_config": {"effort": "low"}},
        messages=[question, {"role": "system", "content": "Answer in one word."},
                  {"role": "user", "content": [{"type": "text", "text": "Go.",
                                                "cache_control": {"type": "ephemeral"}}]}])
    assert "web_search" in raw.headers["x-mlxkit-warning"], raw.headers
    agent_reply = raw.parse()
    assert agent_reply.type == "message", agent_reply
    print("anthropic: messages, stream, tool use round trip, count_tokens, errors, agent shapes")


def check_openai():
    client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused")
    reply = client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": "Say hi."}])
    assert reply.choices[0].finish_reason == "length", reply
    chunks = client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0, stream=True,
        messages=[{"role": "user", "content": "Say hi."}])
    chunks = list(chunks)
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    assert not chunks[0].choices[0].delta.content, chunks[0]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == reply.choices[0].message.content, (streamed, reply)
    several = client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=1, seed=3, n=2,
        messages=[{"role": "user", "content": "Say hi."}])
    assert [c.index for c in several.choices] == [0, 1], several
    texts = ["", ""]
    for chunk in client.chat.completions.create(
            model=MODEL, max_tokens=8, temperature=1, seed=3, n=2, stream=True,
            messages=[{"role": "user", "content": "Say hi."}]):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in several.choices], (texts, several)
    tool = {"type": "function", "function": {
        "name": WEATHER["name"], "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"]}}
    called = client.chat.completions.create(
        model=MODEL, max_tokens=64, temperature=0, tools=[tool], tool_choice="required",
        parallel_tool_calls=False,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    calls = called.choices[0].message.tool_calls
    assert calls and json.loads(calls[0].function.arguments)["city"], called
    first = client.responses.create(
        model=MODEL, instructions="You are terse.", input="Say hi.", max_output_tokens=8,
        temperature=0)
    assert first.status == "incomplete" and first.usage.output_tokens == 8, first
    deltas, final = [], None
    for event in client.responses.create(
            model=MODEL, instructions="You are terse.", input="Say hi.", max_output_tokens=8,
            temperature=0, stream=True):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert "".join(deltas) == first.output_text == final.output_text, (deltas, first)
    follow = client.responses.create(
        model=MODEL, previous_response_id=first.id, input="Again.", max_output_tokens=4,
        temperature=0)
    assert follow.usage.input_tokens_details.cached_tokens > 0, follow.usage
    tool = {"type": "function", "name": WEATHER["name"], "description": WEATHER["description"],
            "parameters": WEATHER["input_schema"]}
    asked = client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[tool],
        tool_choice="required", parallel_tool_calls=False, max_output_tokens=64, temperature=0)
    call = next(o for o in asked.output if o.type == "function_call")
    assert json.loads(call.arguments)["city"], call
    answered = client.responses.create(
        model=MODEL, previous_response_id=asked.id, tools=[tool], max_output_tokens=8,
        temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C"}])
    assert answered.status in ("completed", "incomplete"), answered
    shaped = client.responses.create(
        model=MODEL, input="Name a person, as JSON.", max_output_tokens=60, temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": {
            "type": "object", "properties": {"name": {"type": "string"}},
            "required": ["name"], "additionalProperties": False}}})
    assert isinstance(json.loads(shaped.output_text)["name"], str), shaped
    # What Codex sends: a namespace of functions, a custom (freeform) tool and a built-in tool
    # (left out, said in metadata).
    codex = client.responses.create(
        model=MODEL, input="Ask an agent for help.", max_output_tokens=48, temperature=0,
        tool_choice="required", store=False, include=["reasoning.encrypted_content"],
        prompt_cache_key="thread-1", reasoning={"effort": "low", "summary": "auto"},
        tools=[{"type": "namespace", "name": "collaboration", "description": "Agents.",
                "tools": [{"type": "function", "name": "spawn_agent", "strict": False,
                           "parameters": {"type": "object", "properties": {"task": {
                               "type": "string", "enum": ["list files", "read a file"]}},
                               "required": ["task"], "additionalProperties": False}}]},
               {"type": "web_search"}])
    assert "web_search" in codex.metadata["mlxkit_warning"], codex.metadata
    call = next(o for o in codex.output if o.type == "function_call")
    namespace = getattr(call, "namespace", None) or (call.model_extra or {}).get("namespace")
    assert call.name == "spawn_agent" and namespace == "collaboration", call
    patched = client.responses.create(
        model=MODEL, input="Create hello.txt.", max_output_tokens=48, temperature=0,
        tool_choice="required",
        tools=[{"type": "custom", "name": "apply_patch", "description": "Edit files."}])
    call = next(o for o in patched.output if o.type == "custom_tool_call")
    assert call.name == "apply_patch" and isinstance(call.input, str), call
    embedded = client.embeddings.create(model=MODEL, input=["The cat sat.", "Revenue grew."])
    vectors = [d.embedding for d in embedded.data]
    assert len(vectors) == 2 and all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in vectors)
    print("openai: chat, stream, n choices, function calling, responses (agent tools), embeddings")


def check_ollama():
    client = ollama.Client(host=BASE)
    reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "Say hi."}],
                        options={"temperature": 0, "num_predict": 8})
    assert reply.done and reply.eval_count == 8, reply
    streamed = "".join(part.message.content for part in client.chat(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}],
        options={"temperature": 0, "num_predict": 8}, stream=True))
    assert streamed == reply.message.content, (streamed, reply)
    embedded = client.embed(model=MODEL, input=["The cat sat.", "Revenue grew."])
    assert len(embedded.embeddings) == 2, embedded
    print("ollama: chat, stream, embed")


check_anthropic()
check_openai()
check_ollama()
