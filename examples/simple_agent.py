"""An unmodified agent on the openai SDK: one question, one reply. vime trains it (docs/extend.md)."""

import sys

from openai import OpenAI

client = OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY: from the environment (vime sets them)
question = sys.stdin.read()
reply = client.chat.completions.create(
    model="policy", messages=[{"role": "user", "content": question}]
)
print(reply.choices[0].message.content)
