"""Tasks whose repository lives inside an image (the SWE-bench layout), with a test_patch.

No SWE-bench image can be pulled here, so the image is built locally: the base image
plus a repository committed at /testbed. The task brings its hidden tests as a
``test_patch`` (a git diff), as SWE-bench records do.
"""

from __future__ import annotations

import uuid

import pytest

import vime
from vime.sandbox import SandboxConfig, build_base_image, build_layered_image
from vime.sandbox.leases import close_pools
from vime.suites.swe.grading import _parse_pytest, touched_paths
from vime.suites.swe.tasks import SWETask, load_bundled
from vime.types import Action, ToolCall

ROMAN = next(t for t in load_bundled() if t["id"] == "roman-subtractive")


def _new_file_patch(path: str, text: str) -> str:
    lines = text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"


@pytest.fixture(scope="module")
def image_task(docker_host) -> dict:
    files = {f"/testbed/{rel}": content for rel, content in ROMAN["files"].items()}
    commit = "cd /testbed && git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm base"
    tag = build_layered_image(build_base_image(log=lambda _: None), files, commands=[commit])
    ((hidden_path, hidden_text),) = ROMAN["hidden_tests"].items()
    return SWETask(
        id="image-roman",
        problem_statement=ROMAN["problem_statement"],
        fail_to_pass=ROMAN["fail_to_pass"],
        pass_to_pass=ROMAN["pass_to_pass"],
        image=tag,
        repo_dir="/testbed",
        test_patch=_new_file_patch(hidden_path, hidden_text),
        protected=[*touched_paths(_new_file_patch(hidden_path, hidden_text)), "tests/*"],
    ).to_record()


@pytest.mark.docker
def test_image_task_fix_and_tamper(image_task):
    tag = uuid.uuid4().hex[:12]
    sandbox = SandboxConfig(
        memory="512m", env={"HOME": "/tmp"}, labels={"vime.env": "swe", "vime.test": tag}
    )
    env = vime.make("vime/SWE-v0", sandbox=sandbox)
    fix = [
        ToolCall("str_replace", {"path": p, "old_str": o, "new_str": n})
        for p, o, n in ROMAN["solution"]
    ]
    submit = Action(text="", tool_calls=[ToolCall("submit", {})])

    messages, _ = env.reset(options={"task": image_task})
    assert "/testbed" in messages[0]["content"]
    out = env.step(Action(text="", tool_calls=[ToolCall("bash", {"command": "pwd; ls tests"})]))[0][
        0
    ]["content"]
    assert "/testbed" in out and "test_hidden" not in out
    env.step(Action(text="", tool_calls=fix))
    _, reward, term, _, info = env.step(submit)
    assert (reward, term, info["resolved"]) == (1.0, True, True), info

    env.reset(options={"task": image_task})
    cheat = ToolCall("write_file", {"path": "tests/test_hidden_roman.py", "content": "x = 1\n"})
    env.step(Action(text="", tool_calls=[*fix, cheat]))
    _, reward, _, _, info = env.step(submit)
    assert reward == 0.0 and "protected" in info["reason"]
    env.close()
    import docker

    close_pools()  # warm pooled sandboxes live until their pool is closed
    assert docker.from_env().containers.list(all=True, filters={"label": f"vime.test={tag}"}) == []


def test_pytest_summary_parsing():
    output = (
        "tests/test_a.py::test_x PASSED\n"
        "=========================== short test summary info ============================\n"
        "PASSED tests/test_a.py::test_x\n"
        "FAILED tests/test_a.py::test_y - AssertionError: 1 != 2\n"
        "ERROR tests/test_b.py::test_z\n"
        "XFAIL tests/test_b.py::test_w - reason\n"
    )
    assert _parse_pytest(output) == {
        "tests/test_a.py::test_x": "passed",
        "tests/test_a.py::test_y": "failed",
        "tests/test_b.py::test_z": "failed",
        "tests/test_b.py::test_w": "passed",
    }
