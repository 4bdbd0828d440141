"""inikit: an INI reader and writer with typed getters (pytest suite)."""

from ._kit import Issue, Repo

REPO = Repo(
    "inikit",
    {
        "README.md": "# inikit\n\n`cfg = inikit.loads(text)`; `cfg.get(section, key)`, "
        "`cfg.getint`, `cfg.getbool`; `inikit.dumps(cfg)` writes it back.\n",
        "inikit/__init__.py": """\
from inikit.config import Config
from inikit.parser import loads
from inikit.writer import dumps

__all__ = ["Config", "dumps", "loads"]
""",
        "inikit/lexer.py": '''\
"""Splitting INI text into (kind, line number, payload) tokens."""


def tokens(text):
    """Yield ``("section", n, name)`` and ``("pair", n, (key, value))`` tokens."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            yield "section", number, line[1:-1].strip()
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected 'key = value', got {raw!r}")
        key, value = line.split("=", 1)
        for marker in (" ;", " #"):
            value = value.split(marker, 1)[0]
        yield "pair", number, (key.strip(), value.strip())
''',
        "inikit/parser.py": '''\
"""Building a Config from tokens."""

from inikit.config import Config
from inikit.lexer import tokens


def loads(text):
    """Parse INI ``text`` into a :class:`Config`; keys before any section go to ``DEFAULT``."""
    config = Config()
    section = "DEFAULT"
    for kind, number, payload in tokens(text):
        if kind == "section":
            section = payload.lower()
            config.add_section(section)
        else:
            key, value = payload
            config.set(section, key, value)
    return config
''',
        "inikit/config.py": '''\
"""The parsed configuration: sections of string values, with typed getters."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class Config:
    def __init__(self):
        self.sections = {}

    def add_section(self, name):
        self.sections.setdefault(name, {})

    def set(self, section, key, value):
        self.sections.setdefault(section, {})[key] = value

    def get(self, section, key, default=None):
        """The string value, or ``default`` when the section or key is missing."""
        return self.sections.get(section.lower(), {}).get(key, default)

    def getint(self, section, key, default=None):
        value = self.get(section, key)
        return default if value is None else int(value)

    def getbool(self, section, key, default=None):
        value = self.get(section, key)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise ValueError(f"[{section}] {key}: not a boolean: {value!r}")
''',
        "inikit/writer.py": '''\
"""Writing a Config back as INI text."""


def dumps(config):
    """INI text for ``config``: sections in insertion order, one ``key = value`` per line."""
    blocks = []
    for name, values in config.sections.items():
        lines = [] if name == "DEFAULT" else [f"[{name}]"]
        lines += [f"{key} = {value}" for key, value in values.items()]
        blocks.append("\\n".join(lines))
    return "\\n\\n".join(blocks) + "\\n"
''',
        "tests/test_parser.py": """\
import pytest

from inikit import loads


def test_sections_and_pairs():
    cfg = loads("[server]\\nhost = example.org\\nport=8080\\n")
    assert cfg.get("server", "host") == "example.org"
    assert cfg.getint("server", "port") == 8080


def test_comments_and_blank_lines():
    cfg = loads("# top\\n\\n[a]\\n; note\\nx = 1\\n")
    assert cfg.get("a", "x") == "1"


def test_missing_equals():
    with pytest.raises(ValueError, match="line 2"):
        loads("[a]\\njust words\\n")
""",
        "tests/test_config.py": """\
from inikit import loads


def test_getbool():
    cfg = loads("[f]\\na = true\\nb = 0\\n")
    assert cfg.getbool("f", "a") is True
    assert cfg.getbool("f", "b") is False


def test_defaults():
    cfg = loads("[f]\\n")
    assert cfg.get("f", "nope", "d") == "d"
    assert cfg.getint("g", "nope") is None
""",
        "tests/test_writer.py": """\
from inikit import dumps, loads


def test_round_trip():
    text = "[a]\\nx = 1\\n\\n[b]\\ny = two words\\n"
    assert dumps(loads(text)) == text
""",
    },
    runner="pytest",
)

TASKS = REPO.tasks(
    [
        Issue(
            "inline-comments",
            """\
Inline comments end up in values

With `port = 8080 ; the admin port` the value of `port` is "8080 ; the admin port" and
`getint` fails. A ` ;` or ` #` after a value starts an inline comment and must be dropped
(a `;` or `#` inside a value with no space before it, like `a;b`, is kept).
""",
            [
                (
                    "inikit/lexer.py",
                    """        key, value = line.split("=", 1)
        for marker in (" ;", " #"):
            value = value.split(marker, 1)[0]
""",
                    """        key, value = line.split("=", 1)
""",
                )
            ],
            """\
from inikit import loads


def test_semicolon_comment():
    cfg = loads("[s]\\nport = 8080 ; the admin port\\n")
    assert cfg.getint("s", "port") == 8080


def test_hash_comment():
    assert loads("[s]\\nname = web # front end\\n").get("s", "name") == "web"


def test_value_keeps_inner_semicolon():
    assert loads("[s]\\npath = a;b\\n").get("s", "path") == "a;b"
""",
            fail=["test_semicolon_comment", "test_hash_comment"],
            keep=["test_value_keeps_inner_semicolon"],
        ),
        Issue(
            "getbool-words",
            """\
`getbool` rejects "yes", "no", "on" and "off"

`loads("[f]\\nverbose = yes").getbool("f", "verbose")` raises
`ValueError: not a boolean: 'yes'`. Like other INI readers, yes/no and on/off (in any
case: "Yes", "OFF") should be read as booleans, along with 1/0 and true/false.
""",
            [
                ("inikit/config.py", '_TRUE = {"1", "true", "yes", "on"}', '_TRUE = {"1", "true"}'),
                (
                    "inikit/config.py",
                    '_FALSE = {"0", "false", "no", "off"}',
                    '_FALSE = {"0", "false"}',
                ),
            ],
            """\
import pytest

from inikit import loads


def test_yes_no_on_off():
    cfg = loads("[f]\\na = yes\\nb = No\\nc = ON\\nd = off\\n")
    assert [cfg.getbool("f", k) for k in "abcd"] == [True, False, True, False]


def test_still_rejects_garbage():
    with pytest.raises(ValueError):
        loads("[f]\\na = maybe\\n").getbool("f", "a")
""",
            fail=["test_yes_no_on_off"],
            keep=["test_still_rejects_garbage"],
        ),
        Issue(
            "section-names-case-insensitive",
            """\
Section names are case sensitive

A file with `[Server]` can only be read with `cfg.get("Server", "host")`; `cfg.get("server",
"host")` returns None. Section names should be case-insensitive everywhere (reading and
looking up), as in most INI dialects; keys stay case sensitive.
""",
            [
                ("inikit/parser.py", "section = payload.lower()", "section = payload"),
                (
                    "inikit/config.py",
                    "self.sections.get(section.lower(), {})",
                    "self.sections.get(section, {})",
                ),
            ],
            """\
from inikit import loads


def test_mixed_case_sections():
    cfg = loads("[Server]\\nhost = a\\n[DATABASE]\\nName = b\\n")
    assert cfg.get("server", "host") == "a"
    assert cfg.get("SERVER", "host") == "a"
    assert cfg.get("Database", "Name") == "b"


def test_keys_stay_case_sensitive():
    assert loads("[s]\\nKey = 1\\n").get("s", "key") is None
""",
            fail=["test_mixed_case_sections"],
            keep=["test_keys_stay_case_sensitive"],
        ),
        Issue(
            "dump-default-section",
            """\
`dumps` writes keys before the first section under a `[DEFAULT]` header

`dumps(loads("debug = 1\\n[a]\\nx = 2\\n"))` produces `[DEFAULT]\\ndebug = 1\\n\\n[a]...`.
Keys that had no section should be written first, without any header, so that the text
round-trips. A config with only such keys must not start with a blank line either.
""",
            [
                (
                    "inikit/writer.py",
                    """        lines = [] if name == "DEFAULT" else [f"[{name}]"]
""",
                    """        lines = [f"[{name}]"]
""",
                )
            ],
            """\
from inikit import dumps, loads


def test_default_keys_have_no_header():
    text = "debug = 1\\n\\n[a]\\nx = 2\\n"
    assert dumps(loads(text)) == text


def test_only_default_keys():
    assert dumps(loads("a = 1\\nb = 2\\n")) == "a = 1\\nb = 2\\n"


def test_sections_only():
    assert dumps(loads("[z]\\nk = v\\n")) == "[z]\\nk = v\\n"
""",
            fail=["test_default_keys_have_no_header", "test_only_default_keys"],
            keep=["test_sections_only"],
            split="eval",
        ),
    ]
)
