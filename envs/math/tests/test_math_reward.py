"""The math reward on a table of cases, its guards against pathological input, and threads."""

import subprocess
import sys
import threading
import time

import pytest

from vime.envs.answers import extract_boxed
from vime.suites.math.reward import is_pathological, score_answer

B = "\\boxed"
CASES = [
    # (response, gold, reward)  -- equivalent forms
    (f"{B}{{95}}", "95", 1.0),
    (f"37 + 58 = 95. The answer is {B}{{95}}", "95", 1.0),
    (f"{B}{{ 95 }}", "95", 1.0),
    (f"{B}{{95.0}}", "95", 1.0),
    (f"{B}{{0.5}}", "1/2", 1.0),
    (f"{B}{{\\frac{{1}}{{2}}}}", "0.5", 1.0),
    (f"{B}{{\\dfrac{{1}}{{2}}}}", "1/2", 1.0),
    (f"{B}{{1/2}}", "\\frac{1}{2}", 1.0),
    (f"{B}{{-3}}", "-3", 1.0),
    (f"{B}{{1,000}}", "1000", 1.0),
    (f"{B}{{1{{,}}000}}", "1000", 1.0),
    (f"{B}{{$72$}}", "72", 1.0),
    (f"{B}{{72.}}", "72", 1.0),
    (f"{B}{{(x+1)^2}}", "x^2+2x+1", 1.0),
    (f"{B}{{\\frac{{\\sqrt{{2}}}}{{2}}}}", "\\frac{1}{\\sqrt{2}}", 1.0),
    (f"{B}{{2\\pi}}", "2\\pi", 1.0),
    (f"{B}{{x=3}}", "3", 1.0),
    ("\\fbox{12}", "12", 1.0),
    (f"{B}{{1}} first guess, final: {B}{{2}}", "2", 1.0),  # the last box counts
    # wrong answers
    (f"{B}{{96}}", "95", 0.0),
    (f"{B}{{0.51}}", "1/2", 0.0),
    (f"{B}{{-95}}", "95", 0.0),
    (f"{B}{{x^2+1}}", "(x+1)^2", 0.0),
    (f"{B}{{2}} then {B}{{1}}", "2", 0.0),
    (f"{B}{{}}", "4", 0.0),
    # missing or broken box: a format failure, 0 not a crash
    ("95", "95", 0.0),
    ("The answer is 95.", "95", 0.0),
    ("", "95", 0.0),
    (f"{B}{{95", "95", 0.0),
    ("\\boxed 95", "95", 0.0),
    # garbage
    (f"{B}{{banana}}", "95", 0.0),
    (f"{B}{{\\frac{{1}}{{0}}}}", "1", 0.0),
    (f"{B}{{}}}}}}{{{{", "1", 0.0),
    ("\x00\x01\ufffd" * 50, "1", 0.0),
    (f"{B}{{\\undefinedmacro{{3}}}}", "3", 0.0),
    # huge or pathological strings
    ("9" * 200_000, "9", 0.0),
    (f"{B}{{{'9' * 5000}}}", "9", 0.0),
    (f"{B}{{9^{{9^{{9}}}}}}", "1", 0.0),
    (f"{B}{{10^{{10^{{10}}}}}}", "1", 0.0),
    (f"{B}{{9**9**9}}", "1", 0.0),
    (f"{B}{{2^{{100000000}}}}", "1", 0.0),
    (f"{B}{{123456!}}", "1", 0.0),
    (f"{B}{{10^{{10}}^{{10}}}}", "1", 0.0),
    (f"{B}{{(10^{{10}})!}}", "1", 0.0),
    (f"{B}{{10!!!!!!!!}}", "1", 0.0),
    (f"{B}{{(n+1)!}}", "(n+1)!", 1.0),  # refused for sympy, but the exact text still matches
    ("x" * 1_000_000 + f"{B}{{7}}", "7", 1.0),  # a long answer with a valid box still scores
]


@pytest.mark.parametrize(
    ("response", "gold", "reward"), CASES, ids=[f"case{i}" for i in range(len(CASES))]
)
def test_reward_table(response, gold, reward):
    score = score_answer(response, gold)
    assert score.reward == reward, score
    assert score.correct == (reward == 1.0)


def test_table_is_big_enough():
    assert len(CASES) >= 30


def test_score_details():
    assert score_answer("no box here", "1").reason == "no_box"
    wrong = score_answer(f"{B}{{3}}", "4")
    assert (wrong.format_ok, wrong.extracted, wrong.reason) == (True, "3", "wrong")
    assert score_answer(f"{B}{{9^{{9^{{9}}}}}}", "1").reason == "refused"
    assert score_answer(f"{B}{{{'1' * 400}}}", "1").reason == "too_long"


def test_extract_boxed_balances_braces():
    assert extract_boxed(f"{B}{{\\frac{{a}}{{b}}}} end") == "\\frac{a}{b}"
    assert extract_boxed(f"{B}{{unclosed") is None


def test_guards():
    assert is_pathological("2^{1000000000}") and is_pathological("e^{x^{2}}")
    assert not is_pathological("x^{12}+y^2") and not is_pathological("2^{10}")


def test_a_huge_e_exponent_is_refused_not_expanded():
    """math-verify took minutes on ``4E999999`` (GIL held: every thread of a run waits).
    In a child process, so that a regression fails on the timeout."""
    code = (
        "from vime.suites.math.reward import score_answer as s; "
        "print(s(r'\\boxed{4E999999}', '4').reason, s(r'\\boxed{4e66040181676}', '4').reward)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["refused", "0.0"]
    assert is_pathological("4E99999") and not is_pathological("4E9999")


def test_pathological_inputs_are_fast():
    start = time.perf_counter()
    for response, gold, _ in CASES[-12:]:
        score_answer(response, gold)
    assert time.perf_counter() - start < 5.0


def test_scoring_works_in_worker_threads():
    """math-verify's signal-based timeout would fail outside the main thread; ours must not."""
    symbolic = [(r, g, w) for r, g, w in CASES if "x" in g or "pi" in g or "sqrt" in g]
    results: dict[int, float] = {}
    errors = []

    def work(i, response, gold):
        try:
            results[i] = score_answer(response, gold).reward
        except Exception as err:  # pragma: no cover - the assertion below reports it
            errors.append(err)

    threads = [
        threading.Thread(target=work, args=(i, r, g)) for i, (r, g, _) in enumerate(symbolic)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [results[i] for i in range(len(symbolic))] == [w for _, _, w in symbolic]


def test_math_verify_parses_are_kept_and_verdicts_unchanged():
    """The fallback to math-verify keeps its parses per string (a group's samples share
    their gold answer): the same verdicts as a fresh parse and verify, and a repeated
    string is a cache hit."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    from envs.math import reward

    def fresh(pred: str, gold: str) -> bool:
        config = [LatexExtractionConfig(), ExprExtractionConfig()]
        g = parse(f"\\boxed{{{gold}}}", config, parsing_timeout=None)
        p = parse(f"\\boxed{{{pred}}}", config, parsing_timeout=None)
        return bool(g and p and verify(g, p, timeout_seconds=None))

    pairs = [
        ("37+58", "95"),
        (r"\frac{1}{2}", "0.5"),
        ("x^2+2x+1", "(x+1)^2"),
        ("96", "95"),
        ("9 5", "95"),
        ("abc", "95"),
        (r"\sqrt{4}", "2"),
        ("2,3", "3,2"),
    ]
    reward._parsed.cache_clear()
    assert [reward._math_verify_equal(p, g) for p, g in pairs] == [fresh(p, g) for p, g in pairs]
    hits = reward._parsed.cache_info().hits
    assert [reward._math_verify_equal(p, g) for p, g in pairs] == [fresh(p, g) for p, g in pairs]
    assert reward._parsed.cache_info().hits == hits + 2 * len(pairs)
