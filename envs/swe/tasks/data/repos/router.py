"""router: a tiny HTTP router with typed path parameters (pytest suite)."""

from ._kit import Issue, Repo

REPO = Repo(
    "router",
    {
        "README.md": "# router\n\n`r = Router(); r.add('GET', '/users/{id:int}', handler)`; "
        "`r.dispatch('GET', '/users/7?x=1')` returns `(status, body)`; "
        "`r.url_for(name, **params)` builds a named route's path.\n",
        "router/__init__.py": """\
from router.request import parse_query
from router.router import Router

__all__ = ["Router", "parse_query"]
""",
        "router/pattern.py": '''\
"""Compiling route templates such as ``/users/{id:int}`` into matchers."""

import re
from urllib.parse import quote, unquote

_CONVERTERS = {"str": (r"[^/]+", str), "int": (r"-?[0-9]+", int)}
_PARAM = re.compile(r"{(\\w+)(?::(\\w+))?}")


class Pattern:
    def __init__(self, template):
        self.template = template
        self.static = "{" not in template
        self.types = {}
        regex, pos = "", 0
        for match in _PARAM.finditer(template):
            name, kind = match.group(1), match.group(2) or "str"
            if kind not in _CONVERTERS:
                raise ValueError(f"unknown converter {kind!r} in {template!r}")
            regex += re.escape(template[pos : match.start()])
            regex += f"(?P<{name}>{_CONVERTERS[kind][0]})"
            self.types[name] = _CONVERTERS[kind][1]
            pos = match.end()
        regex += re.escape(template[pos:])
        self.regex = re.compile(regex)

    def match(self, path):
        """The converted parameters if ``path`` matches, else None."""
        found = self.regex.fullmatch(path)
        if not found:
            return None
        return {k: self.types[k](unquote(v)) for k, v in found.groupdict().items()}

    def build(self, params):
        """The path with ``params`` filled in (percent-encoded)."""
        missing = set(self.types) - set(params)
        if missing:
            raise KeyError(f"{self.template}: missing parameter(s) {sorted(missing)}")
        return _PARAM.sub(lambda m: quote(str(params[m.group(1)]), safe=""), self.template)
''',
        "router/request.py": '''\
"""Query strings."""

from urllib.parse import unquote_plus


def parse_query(query):
    """``"a=1&b=x+y&a=2"`` -> ``{"a": ["1", "2"], "b": ["x y"]}``."""
    params = {}
    for part in query.split("&"):
        if not part:
            continue
        key, _, value = part.partition("=")
        params.setdefault(unquote_plus(key), []).append(unquote_plus(value))
    return params
''',
        "router/router.py": '''\
"""Dispatching requests to handlers."""

from router.pattern import Pattern
from router.request import parse_query


class Router:
    def __init__(self):
        self.routes = []
        self.names = {}

    def add(self, method, template, handler, name=None):
        """Route ``method template`` to ``handler(params, query)``; ``name`` it for url_for."""
        pattern = Pattern(template)
        self.routes.append((method.upper(), pattern, handler))
        if name is not None:
            self.names[name] = pattern

    def url_for(self, route, /, **params):
        """The path of the route named ``route``: ``url_for("user", id=7) == "/users/7"``."""
        return self.names[route].build(params)

    def _candidates(self, path):
        # Static routes win over parameterised ones, whatever the order they were added in.
        ordered = sorted(self.routes, key=lambda route: not route[1].static)
        for method, pattern, handler in ordered:
            params = pattern.match(path)
            if params is not None:
                yield method, handler, params

    def dispatch(self, method, target):
        """``(status, body)``: the handler's body with 200, or 404 / 405 with a message."""
        path, _, query = target.partition("?")
        allowed = []
        for route_method, handler, params in self._candidates(path):
            if route_method == method.upper():
                return 200, handler(params, parse_query(query))
            allowed.append(route_method)
        if allowed:
            return 405, "method not allowed; allow: " + ", ".join(sorted(set(allowed)))
        return 404, "not found"
''',
        "tests/test_router.py": """\
from router import Router


def echo(params, query):
    return {"params": params, "query": query}


def make():
    r = Router()
    r.add("GET", "/users/{id:int}", echo)
    r.add("GET", "/health", lambda p, q: "ok")
    return r


def test_static():
    assert make().dispatch("GET", "/health") == (200, "ok")


def test_int_param():
    status, body = make().dispatch("get", "/users/42")
    assert status == 200 and body["params"] == {"id": 42}


def test_not_found():
    assert make().dispatch("GET", "/nope")[0] == 404
""",
        "tests/test_request.py": """\
from router import parse_query


def test_simple():
    assert parse_query("a=1&b=two") == {"a": ["1"], "b": ["two"]}


def test_empty():
    assert parse_query("") == {}
""",
    },
    runner="pytest",
)

TASKS = REPO.tasks(
    [
        Issue(
            "method-not-allowed",
            """\
Wrong method gives 404 instead of 405

With only `GET /users/{id:int}` registered, `dispatch("DELETE", "/users/3")` returns
404 "not found". The path exists, so it should be 405 with the allowed methods in the
body: `"method not allowed; allow: GET"` (sorted, comma separated, no duplicates).
""",
            [
                (
                    "router/router.py",
                    """        if allowed:
            return 405, "method not allowed; allow: " + ", ".join(sorted(set(allowed)))
        return 404""",
                    """        return 404""",
                )
            ],
            """\
from router import Router


def test_405_lists_methods():
    r = Router()
    r.add("GET", "/users/{id:int}", lambda p, q: "get")
    r.add("PUT", "/users/{id:int}", lambda p, q: "put")
    assert r.dispatch("DELETE", "/users/3") == (405, "method not allowed; allow: GET, PUT")


def test_404_still():
    r = Router()
    r.add("GET", "/a", lambda p, q: "a")
    assert r.dispatch("POST", "/b") == (404, "not found")
""",
            fail=["test_405_lists_methods"],
            keep=["test_404_still"],
        ),
        Issue(
            "int-params-and-percent-decoding",
            """\
`{id:int}` matches any text, and path parameters are not percent-decoded

`dispatch("GET", "/users/abc")` on a `/users/{id:int}` route crashes with
`ValueError: invalid literal for int()`; it should not match (404). Negative ids like
`/users/-5` must still match. Also a `{name}` parameter in `/files/a%20b.txt` arrives
as "a%20b.txt" instead of "a b.txt".
""",
            [
                (
                    "router/pattern.py",
                    '_CONVERTERS = {"str": (r"[^/]+", str), "int": (r"-?[0-9]+", int)}',
                    '_CONVERTERS = {"str": (r"[^/]+", str), "int": (r"[^/]+", int)}',
                ),
                (
                    "router/pattern.py",
                    "return {k: self.types[k](unquote(v)) for k, v in found.groupdict().items()}",
                    "return {k: self.types[k](v) for k, v in found.groupdict().items()}",
                ),
            ],
            """\
from router import Router


def make():
    r = Router()
    r.add("GET", "/users/{id:int}", lambda p, q: p)
    r.add("GET", "/files/{name}", lambda p, q: p)
    return r


def test_int_rejects_text():
    assert make().dispatch("GET", "/users/abc")[0] == 404


def test_percent_decoded():
    assert make().dispatch("GET", "/files/a%20b.txt") == (200, {"name": "a b.txt"})


def test_negative_int():
    assert make().dispatch("GET", "/users/-5") == (200, {"id": -5})
""",
            fail=["test_int_rejects_text", "test_percent_decoded"],
            keep=["test_negative_int"],
        ),
        Issue(
            "query-repeated-keys",
            """\
Repeated query keys lose values, and `+` is not a space

`parse_query("tag=a&tag=b")` returns `{"tag": ["b"]}`; every value of a repeated key
should be kept in order (`["a", "b"]`). And `q=hello+world` should decode to
"hello world", as in HTML form encoding.
""",
            [
                (
                    "router/request.py",
                    "params.setdefault(unquote_plus(key), []).append(unquote_plus(value))",
                    "params[unquote(key)] = [unquote(value)]",
                ),
                (
                    "router/request.py",
                    "from urllib.parse import unquote_plus",
                    "from urllib.parse import unquote",
                ),
            ],
            """\
from router import Router, parse_query


def test_repeated():
    assert parse_query("tag=a&tag=b&x=1") == {"tag": ["a", "b"], "x": ["1"]}


def test_plus_is_space():
    r = Router()
    r.add("GET", "/search", lambda p, q: q["q"][0])
    assert r.dispatch("GET", "/search?q=hello+world") == (200, "hello world")


def test_percent():
    assert parse_query("a=%41") == {"a": ["A"]}
""",
            fail=["test_repeated", "test_plus_is_space"],
            keep=["test_percent"],
        ),
        Issue(
            "url-for",
            """\
`Router.url_for` is missing: build paths from route names

The README promises reverse routing, but there is no way to name a route or build its
path. Please support `r.add("GET", "/users/{id:int}", show_user, name="user")` and
`r.url_for("user", id=7) == "/users/7"`. Parameter values are percent-encoded
(`url_for("file", name="a b/c")` gives "/files/a%20b%2Fc"), and a missing parameter
raises KeyError naming it.
""",
            [
                (
                    "router/pattern.py",
                    """        return {k: self.types[k](unquote(v)) for k, v in found.groupdict().items()}

    def build(self, params):
        \"\"\"The path with ``params`` filled in (percent-encoded).\"\"\"
        missing = set(self.types) - set(params)
        if missing:
            raise KeyError(f"{self.template}: missing parameter(s) {sorted(missing)}")
        return _PARAM.sub(lambda m: quote(str(params[m.group(1)]), safe=""), self.template)
""",
                    """        return {k: self.types[k](unquote(v)) for k, v in found.groupdict().items()}
""",
                ),
                (
                    "router/pattern.py",
                    "from urllib.parse import quote, unquote",
                    "from urllib.parse import unquote",
                ),
                (
                    "router/router.py",
                    """        self.routes = []
        self.names = {}

    def add(self, method, template, handler, name=None):
        \"\"\"Route ``method template`` to ``handler(params, query)``; ``name`` it for url_for.\"\"\"
        pattern = Pattern(template)
        self.routes.append((method.upper(), pattern, handler))
        if name is not None:
            self.names[name] = pattern

    def url_for(self, route, /, **params):
        \"\"\"The path of the route named ``route``: ``url_for("user", id=7) == "/users/7"``.\"\"\"
        return self.names[route].build(params)
""",
                    """        self.routes = []

    def add(self, method, template, handler):
        self.routes.append((method.upper(), Pattern(template), handler))
""",
                ),
            ],
            """\
import pytest

from router import Router


def make():
    r = Router()
    r.add("GET", "/users/{id:int}", lambda p, q: p, name="user")
    r.add("GET", "/files/{name}/v{version:int}", lambda p, q: p, name="file")
    return r


def test_url_for():
    assert make().url_for("user", id=7) == "/users/7"


def test_url_for_encodes_and_round_trips():
    r = make()
    path = r.url_for("file", name="a b/c", version=2)
    assert path == "/files/a%20b%2Fc/v2"
    assert r.dispatch("GET", path) == (200, {"name": "a b/c", "version": 2})


def test_missing_parameter():
    with pytest.raises(KeyError, match="version"):
        make().url_for("file", name="x")


def test_unnamed_routes_still_work():
    r = Router()
    r.add("GET", "/a", lambda p, q: "a")
    assert r.dispatch("GET", "/a") == (200, "a")
""",
            fail=["test_url_for", "test_url_for_encodes_and_round_trips", "test_missing_parameter"],
            keep=["test_unnamed_routes_still_work"],
        ),
        Issue(
            "static-routes-win",
            """\
`/users/me` is shadowed by `/users/{name}` when added later

```python
r.add("GET", "/users/{name}", profile)
r.add("GET", "/users/me", me)
r.dispatch("GET", "/users/me")   # calls profile with name="me"
```
A static route must win over a parameterised one that also matches, whatever order
they were added in.
""",
            [
                (
                    "router/router.py",
                    """        # Static routes win over parameterised ones, whatever the order they were added in.
        ordered = sorted(self.routes, key=lambda route: not route[1].static)
        for method, pattern, handler in ordered:""",
                    """        for method, pattern, handler in self.routes:""",
                )
            ],
            """\
from router import Router


def test_static_added_later_wins():
    r = Router()
    r.add("GET", "/users/{name}", lambda p, q: "profile " + p["name"])
    r.add("GET", "/users/me", lambda p, q: "me")
    assert r.dispatch("GET", "/users/me") == (200, "me")
    assert r.dispatch("GET", "/users/ann") == (200, "profile ann")


def test_static_added_first():
    r = Router()
    r.add("GET", "/users/me", lambda p, q: "me")
    r.add("GET", "/users/{name}", lambda p, q: "profile")
    assert r.dispatch("GET", "/users/me") == (200, "me")
""",
            fail=["test_static_added_later_wins"],
            keep=["test_static_added_first"],
            split="eval",
        ),
    ]
)
