"""The libraries agents are built on against a live mlxkit server: litellm (as aider uses it)
and LangChain's ChatOllama and ChatOpenAI. A 135M model's words are not judged, only that each
library's requests are served and its answers parse: text, forced tool calls, structured output,
streams.

Usage: clients.py BASE_URL MODEL. Exits non-zero (with the failing assertion) on any mismatch.
"""
import json
import os
import sys

# The bundled price map, not a fetch from GitHub (seconds of retries with no network).
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import litellm  # noqa: E402
from langchain_ollama import ChatOllama  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

BASE, MODEL = sys.argv[1], sys.argv[2]
QUESTION = "What is the weather in Paris?"
SAY_HI = [{"role": "user", "content": "Say hi."}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}}


class Weather(BaseModel):
    """The weather in a city"""

    city: str = Field(description="The city")


def check_litellm():
    greedy = {"temperature": 0, "seed": 1}
    ollama = {"model": "ollama_chat/" + MODEL, "api_base": BASE, **greedy}
    reply = litellm.completion(**ollama, max_tokens=8, messages=SAY_HI)
    text = reply.choices[0].message.content
    assert isinstance(text, str) and text, reply
    assert reply.usage.completion_tokens == 8, reply.usage
    # Ollama's API has no `tool_choice` (litellm drops it), so the call is the model's choice,
    # and smollm2:135m answers in words. What can be checked: the tool reaches the prompt (the
    # issue's LangChain finding was tools silently left out) and any call parses. The question
    # alone is 13 tokens; this is the first request with the tool, so none of the tool's part
    # of the prompt is cached (Ollama's `prompt_eval_count` leaves cached tokens out).
    offered = litellm.completion(
        **ollama, max_tokens=64, tools=[WEATHER_TOOL], tool_choice="required",
        messages=[{"role": "user", "content": QUESTION}])
    assert offered.usage.prompt_tokens > 50, ("the tool did not reach the prompt", offered)
    for call in offered.choices[0].message.tool_calls or []:
        assert isinstance(json.loads(call.function.arguments)["city"], str), offered

    openai = {"model": "openai/" + MODEL, "api_base": BASE + "/v1", "api_key": "unused",
              **greedy}
    reply = litellm.completion(**openai, max_tokens=8, messages=SAY_HI)
    assert reply.choices[0].finish_reason == "length", reply
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in litellm.completion(
        **openai, max_tokens=8, messages=SAY_HI, stream=True))
    assert streamed == reply.choices[0].message.content, (streamed, reply)
    called = litellm.completion(
        **openai, max_tokens=64, tools=[WEATHER_TOOL], tool_choice="required",
        messages=[{"role": "user", "content": QUESTION}])
    calls = called.choices[0].message.tool_calls
    assert calls and isinstance(json.loads(calls[0].function.arguments)["city"], str), called

    # What aider reads for the context size (it sets OLLAMA_API_BASE): `/api/show`'s
    # `<arch>.context_length`.
    os.environ["OLLAMA_API_BASE"] = BASE
    info = litellm.get_model_info("ollama_chat/" + MODEL)
    assert isinstance(info["max_input_tokens"], int) and info["max_input_tokens"] > 0, info
    print(f"litellm: ollama_chat text and tools offered, openai text, stream and forced tool "
          f"call, context size {info['max_input_tokens']} from /api/show")


def check_langchain(name, model, forced):
    """`model(limit)` a chat model of at most `limit` output tokens, `forced` the `tool_choice`
    that forces a call to Weather, or None where the API has none (Ollama's: ChatOllama ignores
    `tool_choice`, the call is the model's choice)."""
    short, chat = model(8), model(64)
    reply = short.invoke("Say hi.")
    assert isinstance(reply.content, str) and reply.content, reply

    if forced:
        called = chat.bind_tools([Weather], tool_choice=forced).invoke(QUESTION)
        assert called.tool_calls, called
        call = called.tool_calls[0]
        assert call["name"] == "Weather", call
        Weather.model_validate(call["args"])
        shaped = chat.with_structured_output(Weather, method="function_calling").invoke(QUESTION)
        assert isinstance(shaped, Weather), shaped
    else:
        # As for litellm: the first request with this tool, so its prompt is evaluated whole.
        offered = chat.bind_tools([Weather]).invoke(QUESTION)
        assert offered.usage_metadata["input_tokens"] > 50, ("no tool in the prompt", offered)
        for call in offered.tool_calls:
            Weather.model_validate(call["args"])
        shaped = chat.with_structured_output(
            Weather, method="function_calling", include_raw=True).invoke(QUESTION)
        assert shaped["parsing_error"] is None, shaped
        assert shaped["parsed"] is None or isinstance(shaped["parsed"], Weather), shaped

    shaped = chat.with_structured_output(Weather, method="json_schema").invoke(QUESTION)
    assert isinstance(shaped, Weather), shaped

    streamed = "".join(str(chunk.content) for chunk in short.stream("Say hi."))
    assert streamed == reply.content, (streamed, reply.content)
    print(f"{name}: invoke, bind_tools{' (forced)' if forced else ' (offered)'}, structured output (function_calling, "
          f"json_schema), stream")


check_litellm()
check_langchain("ChatOllama", lambda limit: ChatOllama(
    model=MODEL, base_url=BASE, temperature=0, seed=1, num_predict=limit), None)
check_langchain("ChatOpenAI", lambda limit: ChatOpenAI(
    model=MODEL, base_url=BASE + "/v1", api_key="unused", temperature=0, seed=1,
    max_tokens=limit), "Weather")
