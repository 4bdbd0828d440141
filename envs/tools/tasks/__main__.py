"""Regenerate the bundled tasks file: ``python -m vime.suites.tools.tasks``."""

from . import DATA, generate_tasks, render_jsonl

DATA.parent.mkdir(parents=True, exist_ok=True)
DATA.write_text(render_jsonl(generate_tasks()))
print(f"wrote {DATA}")
