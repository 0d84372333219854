"""docs/getting-started.md, followed as a newcomer would: its commands, in order, in a fresh home.

The page's blocks run in page order in a temporary ``HOME`` (so ``~/airflow-bos`` is a fresh
``AIRFLOW_HOME`` with an SQLite metadata database), with none of this session's Airflow settings,
this venv's ``bin`` first on ``PATH`` and ``BOS_SRC`` pointing at this source tree. How a ``bash``
block runs is said by the HTML comment right before it:

* ``<!-- run -->``: in bash (``set -eo pipefail``); what it exports holds for the blocks after it;
* ``<!-- run: exits N -->``: the same, and it must end with status N (``exits N, why`` says why);
* ``<!-- run in the background -->``: started and left running (the reference server, the connect
  command waiting for its callback, the API server), stopped at the end;
* ``<!-- not run: the reason -->``: not run (installing into a fresh venv is ``.ci/package``'s job).

The page's ports (8765, 8790, 8080) become free ones. The two ways of delivering the sign-in that
the page shows run with the URL the connect command printed: ``curl -sL`` on the authorization URL
(the reference server consents by itself), and ``curl`` on the callback URL a browser on another
machine would land on (followed here without reaching the listener, as from that machine).
A ``sql`` block runs on the warehouse file and must give the table the page shows after it
(``<!-- result -->``); a ``text`` block after the connect command must appear in its output.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urljoin, urlsplit

import httpx
import pytest

from airflow_provider_bos.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "getting-started.md"
PAGE_PORTS = ("8765", "8790", "8080")  # the reference server, the sign-in listener, the API server

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*(run in the background|run: exits (\d+)(?:,[^>]*)?|run|not run:(.*?))\s*-->$")
_AUTHORIZE = re.compile(r"'http://127\.0\.0\.1:\d+/authorize\?[^']*'")
_CALLBACK = re.compile(r"'http://127\.0\.0\.1:\d+/callback\?[^']*'")


# --- the page ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    line: int
    language: str
    text: str
    mark: str | None  # "run", "background", "not run", or None
    exit_status: int  # for "run"
    not_run_reason: str
    shown: list[tuple[str, ...]] | None  # the table after <!-- result -->, header first

    def __str__(self) -> str:
        return f"getting-started.md:{self.line} ({self.language})"


def _cells(line: str) -> tuple[str, ...]:
    return tuple(cell.strip() for cell in line.strip().strip("|").split("|"))


def _result_after(lines: list[str], start: int) -> list[tuple[str, ...]] | None:
    for i in range(start, len(lines)):
        if lines[i].startswith(("```", "#")):
            return None
        if lines[i].strip() == "<!-- result -->":
            rows = []
            for line in lines[i + 1:]:
                if not line.strip() and not rows:
                    continue
                if not line.startswith("|"):
                    break
                rows.append(line)
            assert len(rows) > 2, f"getting-started.md:{i + 1}: <!-- result --> without a table"
            return [_cells(rows[0]), *(_cells(row) for row in rows[2:])]
    return None


def _kind(mark: re.Match[str] | None) -> str | None:
    if mark is None:
        return None
    if mark.group(3) is not None:
        return "not run"
    return "background" if mark.group(1) == "run in the background" else "run"


def page_blocks() -> list[Block]:
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None or not fence.group(1):
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = _MARK.match(before)
        blocks.append(Block(
            line=i + 1, language=fence.group(1), text="\n".join(lines[i + 1:end]) + "\n", mark=_kind(mark),
            exit_status=int(mark.group(2)) if mark and mark.group(2) else 0,
            not_run_reason=(mark.group(3) or "").strip() if mark else "",
            shown=_result_after(lines, end + 1)))
        i = end + 1
    return blocks


def command_lines(text: str) -> Iterator[list[str]]:
    """Each command of a shell block as words (continuation lines joined, comments dropped)."""
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        for start, word in enumerate(words):
            # A command starts a line or follows an operator (not `grep airflow-provider-bos`).
            if word == "airflow-provider-bos" and (start == 0 or words[start - 1] in ("|", "||", "&&", ";")):
                yield words[start:]


# --- the fast check: every block says how it runs, every CLI call the page shows parses -----------

def test_every_block_of_the_page_says_how_it_runs_and_its_cli_calls_parse() -> None:
    blocks = page_blocks()
    shells = [b for b in blocks if b.language == "bash"]
    assert shells, "the page shows no shell block"
    for block in shells:
        assert block.mark is not None, (
            f"{block}: mark it <!-- run -->, <!-- run in the background --> or <!-- not run: why -->")
        if block.mark == "not run":
            assert len(block.not_run_reason.split()) >= 3, f"{block}: <!-- not run: ... --> must say why"
    for block in blocks:
        if block.language == "sql":
            assert block.shown is not None, f"{block}: show its answer (<!-- result --> and a table)"
    parser = build_parser()
    calls = [words for block in shells for words in command_lines(block.text)]
    assert any(words[1:2] == ["connect"] for words in calls)
    for words in calls:
        try:
            parser.parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"the page's `{shlex.join(words)}` is not a valid airflow-provider-bos call")
    # The sign-in the page describes is the one without a browser, saved into Airflow.
    connect = next(words for words in calls if words[1:2] == ["connect"])
    assert {"--no-browser", "--save-connection"} <= set(connect)


# --- running the page -----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Background:
    """A block started with bash in its own process group; its output collected line by line."""

    def __init__(self, script: str, env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(["bash", "-c", script], env=env, cwd=cwd, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, found: Callable[[str], str | None], what: str, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for line in self.lines:
                    hit = found(line)
                    if hit:
                        return hit
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"no {what} in the output:\n{self.output()[-3000:]}")
                self._changed.wait(min(left, 1.0))

    def finish(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _authorize_url(line: str) -> str | None:
    line = line.strip()
    return line if re.match(r"^http://127\.0\.0\.1:\d+/authorize\?", line) else None


def browser_elsewhere(authorization_url: str) -> str:
    """What a browser on another machine ends on: the callback URL, never requested (it cannot reach it)."""
    redirect_uri = dict(parse_qsl(urlsplit(authorization_url).query))["redirect_uri"]
    url = authorization_url
    with httpx.Client(timeout=30) as browser:
        for _ in range(10):
            response = browser.get(url, follow_redirects=False)
            assert response.is_redirect, f"{urlsplit(url).path} answered {response.status_code}"
            url = urljoin(url, response.headers["location"])
            if url.startswith(redirect_uri + "?"):
                return url
    raise AssertionError("the sign-in never redirected to the callback")


class PageRun:
    """The page followed in order: a shell state carried between blocks, background processes."""

    def __init__(self, tmp: Path, ports: dict[str, str]) -> None:
        self.tmp, self.ports = tmp, ports
        home = tmp / "home"
        home.mkdir()
        # This session's Airflow (its own AIRFLOW_HOME, database, connections) stays out.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(HOME=str(home), BOS_SRC=str(REPO), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
        self.env = env
        self.background: list[Background] = []
        self.connect_block: Block | None = None
        self.connect: Background | None = None
        self.connect_outputs: list[str] = []

    def text_of(self, block: Block, **other_ports: str) -> str:
        ports = {**self.ports, **other_ports}
        # One pass: a port put in must not be rewritten as if it were the page's.
        return re.sub(r"\b(" + "|".join(ports) + r")\b", lambda m: ports[m.group(1)], block.text)

    def shell(self, script: str, expect: int = 0) -> str:
        env_out = self.tmp / "env.out"
        full = f"set -eo pipefail\n{script}\nenv -0 > {shlex.quote(str(env_out))}\n"
        proc = subprocess.run(["bash", "-c", full], env=self.env, cwd=self.tmp, text=True, capture_output=True,
                              timeout=600, check=False)
        output = proc.stdout + proc.stderr
        assert proc.returncode == expect, f"exit status {proc.returncode}, not {expect}:\n{script}\n{output[-4000:]}"
        if expect == 0:
            self.env = dict(item.split("=", 1) for item in env_out.read_text().split("\0") if "=" in item)
        return output

    def start(self, block: Block, **other_ports: str) -> Background:
        process = Background(self.text_of(block, **other_ports), self.env, self.tmp)
        self.background.append(process)
        return process

    def start_connect(self) -> str:
        assert self.connect_block is not None
        # The second sign-in on the page's port again, right after the first (it stands for another day).
        self.connect = self.start(self.connect_block)
        return self.connect.wait_for(_authorize_url, "sign-in URL")

    def connect_finished(self) -> None:
        assert self.connect is not None
        assert self.connect.finish(60) == 0, self.connect.output()
        self.connect_outputs.append(self.connect.output())
        self.connect = None

    def warehouse(self) -> Path:
        return Path(self.env["AIRFLOW_HOME"]) / "warehouse.db"

    def stop_all(self) -> None:
        for process in reversed(self.background):
            process.stop()


def run_block(block: Block, page: PageRun) -> None:
    text = page.text_of(block)
    if block.language == "sql":
        with sqlite3.connect(page.warehouse()) as db:
            cursor = db.execute(text)
            header = tuple(column[0] for column in cursor.description)
            rows = [tuple("NULL" if v is None else str(v) for v in row) for row in cursor]
        assert block.shown is not None
        assert [header, *rows] == block.shown, f"{block}: the page shows another answer than the table gives"
        return
    if block.language == "text" and "Connected '" in text:
        shown = [line for line in text.splitlines() if line.strip() and line.strip() != "..."]
        assert page.connect_outputs, f"{block}: shown before any sign-in"
        for output in page.connect_outputs:
            for line in shown:
                assert line in output, f"{block}: `{line}` is not in the connect command's output:\n{output}"
        return
    if block.language != "bash" or block.mark in (None, "not run"):
        return
    if block.mark == "background":
        if "airflow-provider-bos connect" in text:
            page.connect_block = block
            page.start_connect()
            return
        process = page.start(block)
        if "testing.server" in text:
            process.wait_for(lambda line: line if "/mcp/apps/bos/platform" in line else None, "MCP URL")
        elif "api-server" in text:
            check_health_page(page, process)
        return
    if _AUTHORIZE.search(text):  # the reference server: curl plays the browser on this machine
        assert page.connect is not None, f"{block}: no connect command is waiting"
        url = page.connect.wait_for(_authorize_url, "sign-in URL")
        page.shell(_AUTHORIZE.sub(lambda _: shlex.quote(url), text))
        page.connect_finished()
        return
    if _CALLBACK.search(text):  # a browser on another machine; its address bar handed over with curl
        if page.connect is None:
            page.start_connect()
        assert page.connect is not None
        callback = browser_elsewhere(page.connect.wait_for(_authorize_url, "sign-in URL"))
        output = page.shell(_CALLBACK.sub(lambda _: shlex.quote(callback), text))
        assert "Sign-in received" in output
        page.connect_finished()
        return
    page.shell(text, expect=block.exit_status)


def check_health_page(page: PageRun, api_server: Background) -> None:
    """The sync-health page the page sends the reader to lists the table, once the API server answers."""
    url = f"http://127.0.0.1:{page.ports['8080']}/bos/health/"
    deadline = time.monotonic() + 180
    while True:
        try:
            response = httpx.get(url, timeout=30)
            if response.status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert api_server.proc.poll() is None, f"the API server exited:\n{api_server.output()[-3000:]}"
        assert time.monotonic() < deadline, f"the API server did not answer in time:\n{api_server.output()[-3000:]}"
        time.sleep(2)
    assert "bos_people_daily" in response.text


@pytest.mark.airflow
@pytest.mark.slow
def test_the_page_followed_from_a_fresh_home_gives_a_synced_table(tmp_path: Path) -> None:
    ports = {page_port: str(_free_port()) for page_port in PAGE_PORTS}
    page = PageRun(tmp_path, ports)
    try:
        for block in page_blocks():
            run_block(block, page)
    finally:
        page.stop_all()
    # Both ways of delivering the sign-in ran, the DAG ran three times, and its table is the page's.
    assert len(page.connect_outputs) == 2, page.connect_outputs
    with sqlite3.connect(page.warehouse()) as db:
        assert db.execute("SELECT COUNT(*) FROM bos_sync_runs").fetchone() == (3,)
