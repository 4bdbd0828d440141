"""Two tiny local "SWE-bench instances" (git repos with a real bug, a test_patch, a gold patch).

- ``pallets__flask-1``: a pytest suite (swebench maps ``pallets/flask`` to its pytest
  parser); the install spec "installs" the package with a ``.pth`` file, so the default
  ``pytest -rA`` command imports it.
- ``django__django-1``: a unittest suite run verbosely (swebench's Django parser reads
  ``test (module.Class.test) ... ok`` lines).

Each repository has a later commit holding the fix, so a snapshot exported at
``base_commit`` must not contain it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

FLASK_FILES = {
    "slugger/__init__.py": "from .slug import slugify\n",
    "slugger/slug.py": 'def slugify(text):\n    return "-".join(text.lower().split(" "))\n',
    "tests/test_slug.py": (
        "from slugger import slugify\n\n\n"
        'def test_simple():\n    assert slugify("Hello World") == "hello-world"\n'
    ),
}
FLASK_FIXED = 'def slugify(text):\n    return "-".join(text.lower().split())\n'
FLASK_NEW_TEST = (
    '\n\ndef test_many_spaces():\n    assert slugify("  Hello   World ") == "hello-world"\n'
)

DJANGO_FILES = {
    "mini/__init__.py": "",
    "mini/dates.py": (
        "def is_leap(year):\n    return year % 4 == 0\n"  # wrong for 1900, 2100
    ),
    "tests/__init__.py": "",
    "tests/test_dates.py": (
        "import unittest\n\nfrom mini.dates import is_leap\n\n\n"
        "class LeapTests(unittest.TestCase):\n"
        "    def test_2024(self):\n        self.assertTrue(is_leap(2024))\n"
    ),
}
DJANGO_FIXED = (
    "def is_leap(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n"
)
DJANGO_NEW_TEST = "\n    def test_1900(self):\n        self.assertFalse(is_leap(1900))\n"

INSTALL_SPECS = {
    "pallets/flask": {
        "*": {
            # What `pip install -e .` does for the import path, without pip in the image.
            "install": [
                "echo /testbed > /usr/local/lib/python3.11/dist-packages/testbed.pth",
                "python3 -c 'import slugger'",
            ]
        }
    },
    "django/django": {"3.0": {"test_cmd": "python3 -m unittest -v {test_modules}"}},
}


def _git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    out = subprocess.run(["git", *ident, *args], cwd=repo, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _diff(repo: Path, path: str, new_text: str) -> str:
    """The unified diff that turns ``path`` into ``new_text`` (the worktree is restored)."""
    old = (repo / path).read_text()
    (repo / path).write_text(new_text)
    diff = _git(repo, "diff", "--", path)
    (repo / path).write_text(old)
    return diff


def _make_repo(
    root: Path, name: str, files: dict[str, str], fix: tuple[str, str], test: tuple[str, str]
) -> dict[str, str]:
    """A git repo at ``root/name`` with base, then the fix committed; the record's patches."""
    repo = root / name
    repo.mkdir(parents=True)
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    patch = _diff(repo, fix[0], fix[1])
    test_patch = _diff(repo, test[0], files[test[0]] + test[1])
    (repo / fix[0]).write_text(fix[1])
    _git(repo, "commit", "-qam", "the fix (after base_commit)")
    return {"base_commit": base, "patch": patch, "test_patch": test_patch}


def make_instances(root: Path) -> tuple[Path, list[dict[str, Any]]]:
    """Build the repos under ``root/repos``; returns that folder and the two records."""
    repos = root / "repos"
    flask = _make_repo(
        repos,
        "pallets__flask",
        FLASK_FILES,
        ("slugger/slug.py", FLASK_FIXED),
        ("tests/test_slug.py", FLASK_NEW_TEST),
    )
    django = _make_repo(
        repos,
        "django__django",
        DJANGO_FILES,
        ("mini/dates.py", DJANGO_FIXED),
        ("tests/test_dates.py", DJANGO_NEW_TEST),
    )
    records = [
        {
            "instance_id": "pallets__flask-1",
            "repo": "pallets/flask",
            "version": "2.0",
            "problem_statement": "slugify('  Hello   World ') gives '--hello---world-'.",
            "hints_text": "",
            "created_at": "2026-01-01T00:00:00Z",
            "environment_setup_commit": flask["base_commit"],
            "FAIL_TO_PASS": json.dumps(["tests/test_slug.py::test_many_spaces"]),
            "PASS_TO_PASS": json.dumps(["tests/test_slug.py::test_simple"]),
            **flask,
        },
        {
            "instance_id": "django__django-1",
            "repo": "django/django",
            "version": "3.0",
            "problem_statement": "is_leap(1900) is True; century years are leap only if /400.",
            "hints_text": "",
            "created_at": "2026-01-01T00:00:00Z",
            "environment_setup_commit": django["base_commit"],
            "FAIL_TO_PASS": json.dumps(["test_1900 (tests.test_dates.LeapTests.test_1900)"]),
            "PASS_TO_PASS": json.dumps(["test_2024 (tests.test_dates.LeapTests.test_2024)"]),
            **django,
        },
    ]
    return repos, records


def write_forms(root: Path, records: list[dict[str, Any]]) -> dict[str, Path]:
    """The records in every supported file form: one .json, a .json list, .jsonl, .parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    forms = {
        "json_one": root / "one.json",
        "json_list": root / "list.json",
        "jsonl": root / "records.jsonl",
        "parquet": root / "records.parquet",
    }
    forms["json_one"].write_text(json.dumps(records[0], indent=2))
    forms["json_list"].write_text(json.dumps(records))
    forms["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in records))
    pq.write_table(pa.Table.from_pylist(records), forms["parquet"])
    return forms
