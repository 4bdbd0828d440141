"""An unmodified agent: the openai SDK and one tool. vime trains it (docs/own_agent.md)."""

import json
import sys

from openai import OpenAI

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                      "b": {"type": "integer"}}, "required": ["a", "b"]}}}  # fmt: skip
client = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY: from the environment (vime sets them)
messages = [{"role": "user", "content": sys.stdin.read()}]
for _ in range(4):
    reply = client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls:
        break
    for call in message.tool_calls:
        args = json.loads(call.function.arguments)
        result = json.dumps({"result": args["a"] + args["b"]})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
print(message.content)
