"""Checks /app/count.txt against the words of /app/words.txt (counted here, not trusted)."""

from pathlib import Path

expected = len(Path("/app/words.txt").read_text().split())
got = Path("/app/count.txt").read_text().strip()
assert got == str(expected), f"count.txt says {got!r}, the file has {expected} words"
print("count ok:", expected)
