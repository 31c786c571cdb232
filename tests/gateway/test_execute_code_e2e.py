"""``execute_code`` through a whole gateway: the real Telegram adapter against the Bot API simulator, the scripted
model, scripts in bubblewrap workers. What a script computes and reads, the limits that end it, the secrets it
cannot see, and the schema that offers it only the run's tools."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gateway.sim.model_server import tool_call
from tests.gateway.telegram_chat import CHAT, TelegramChat, telegram_chat
from tests.sandbox_support import require_bwrap
from tools.sandbox.policy import NOBODY

HANG_GUARD = 60.0  # seconds: only a broken gateway takes this long
CANARY = "zq7canary-gateway-environment-8d3f0b61"
# A script asks for approval in mode dangerous (tests/gateway/test_approval_policy.py); this user said "always".
TRUSTED = {"approvals": {"trusted": {f"telegram:{CHAT}": ["execute_code:*"]}}}
LIMITS = {"tools": {"execute_code": {"memory_mb": 256, "max_timeout": 60}}, **TRUSTED}
PRIMES = textwrap.dedent("""
    import os
    from hermes_tools import read_file
    primes = [n for n in range(2, 10_000) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
    print("sum of primes:", sum(primes))
    print("notes:", read_file("notes.txt")["content"])
    print("uid:", os.getuid())
""")


async def _run_code(chat: TelegramChat, prompt: str, code: str, **args: Any) -> dict[str, Any]:
    """The user sends ``prompt``, the model answers it with an execute_code call of ``code``; the result the model
    got back (after the gateway's answer to the chat)."""
    chat.script.on(prompt, tool_call("execute_code", {"code": code, **args}))
    before = len(chat.bot_messages())
    await chat.says(prompt)
    answer = (await chat.sim.wait_for_messages(before + 1, CHAT, timeout=HANG_GUARD))[before]
    assert (answer.text or "").startswith("Done: "), answer.text  # the scripted model saw the tool's result
    last = chat.model.requests[-1]["messages"][-1]
    assert last["role"] == "tool", last
    return json.loads(last["content"])


def _execute_code_description(chat: TelegramChat) -> str:
    [tool] = [t for t in chat.model.requests[0]["tools"] if t["function"]["name"] == "execute_code"]
    return str(tool["function"]["description"])


async def test_execute_code_computes_reads_and_is_killed_at_its_limits(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    require_bwrap()
    monkeypatch.setenv("HERMES_CANARY_CODE", CANARY)
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "notes.txt").write_text("the answer is 42\n")
    async with telegram_chat(tmp_path) as chat:
        gateway = await chat.start(LIMITS)
        assert gateway.sandbox is not None and gateway.sandbox.isolation.level == "bwrap"

        computed = await _run_code(chat, "sum the primes", PRIMES)
        assert computed["exit_code"] == 0 and computed["tool_calls"] == 1, computed
        lines = computed["stdout"].splitlines()
        assert lines[0] == "sum of primes: 5736396"
        assert lines[1] == "notes:     1|the answer is 42", lines
        if os.geteuid() == 0:  # in the sandbox, as its user
            assert lines[2] == f"uid: {NOBODY}"

        endless = await _run_code(chat, "spin forever", "while True:\n    pass", timeout=2)
        assert endless["error"] == ("execute_code: timed out after 2 s; the script was killed (its timeout argument "
                                    "allows up to 60 s)"), endless
        # Only the script died: its worker serves the next call, nothing was replaced.
        again = await _run_code(chat, "sum the primes again", PRIMES)
        assert again["stdout"].startswith("sum of primes: 5736396\n"), again
        assert gateway.sandbox.stats()["killed"] == 0

        hog = await _run_code(chat, "use memory", "block = bytearray(600 * 1024 ** 2)\nprint('allocated')")
        assert hog["error"] == "execute_code: the script ran out of memory (its limit is 256 MB)", hog
        assert "allocated" not in hog["stdout"] and hog["stderr"].rstrip().endswith("MemoryError")

        env = await _run_code(chat, "show the environment", "import json, os\nprint(json.dumps(dict(os.environ)))")
        seen = json.loads(env["stdout"])
        assert "HERMES_WORKSPACE" in seen and CANARY not in json.dumps(seen), seen
        assert os.environ["HERMES_CANARY_CODE"] == CANARY  # the gateway has it

        runs = [r for r in await chat.store.list_runs(20) if r.prompt == "sum the primes"]
        assert [c["name"] for c in runs[0].tool_calls] == ["execute_code"] and not runs[0].tool_calls[0]["error"]

        # The schema offered the run's sandboxed tools, and only those.
        description = _execute_code_description(chat)
        assert "from hermes_tools import patch, read_file, search_files, terminal, write_file)" in description
        assert "at most 256 MB of memory" in description
        for absent in ("memory", "todo", "cronjob", "web_search", "web_extract", "send_file", "delegate_task"):
            assert f"{absent}(" not in description, absent


async def test_a_run_without_the_file_tools_offers_a_script_only_the_terminal(tmp_path: Path) -> None:
    require_bwrap()
    async with telegram_chat(tmp_path) as chat:
        await chat.start({"toolsets": {"telegram": ["code_execution", "terminal"]}, **TRUSTED})
        offered = await _run_code(chat, "what can you call?",
                                  "import json, hermes_tools\nprint(json.dumps(hermes_tools.__all__))")
        assert json.loads(offered["stdout"]) == ["terminal"], offered
        description = _execute_code_description(chat)
        assert "(from hermes_tools import terminal)" in description
        assert "search_files" not in description and "read_file" not in description
        assert {t["function"]["name"] for t in chat.model.requests[0]["tools"]} == {"execute_code", "terminal"}
        missing = await _run_code(chat, "read a file", "from hermes_tools import read_file")
        assert missing["exit_code"] == 1 and "ImportError: cannot import name 'read_file'" in missing["stderr"]
