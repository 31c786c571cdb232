"""The model's Markdown rendered per platform (platforms/rich_text.py): exact markup for each construct, and
end to end through the real adapters to the simulators, long answers split as the gateway splits them."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from html.parser import HTMLParser

import pytest
from discord.gateway import DiscordWebSocket
from discord.http import Route
from hypothesis import example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from gateway.sim.discord_api import DiscordSimulator
from gateway.sim.slack_api import DEFAULT_CHANNEL, SlackSimulator
from gateway.sim.telegram_api import DEFAULT_USER_ID, MAX_TEXT_LENGTH, TelegramSimulator, parse_entities
from platforms.base import Accepted, BasePlatformAdapter, MessageEvent, split_message, utf16_len
from platforms.discord import DiscordAdapter, DiscordSettings
from platforms.rich_text import telegram_length, telegram_text, to_discord, to_mrkdwn, to_telegram_html
from platforms.slack import MAX_PART_LENGTH, SlackAdapter, SlackSettings
from platforms.telegram import TelegramAdapter, TelegramSettings

SAMPLE = """## Results for <b> & "friends"

Prices went **up** by *5%*, ~~down~~ never; see [the report](https://example.com/r?a=1&b=2) or `x < y`.

- apples
  - green & red
    1. first
    2. second
- pears

> Keep **calm**
> and carry on.

| fruit | qty | note |
|:------|----:|:----:|
| apple | 3 | 🍎 |
| kiwi | 12 | a\\|b |

```python
if a < b and c > d:
    print("&")
```"""

_TABLE_TEXT = """fruit | qty | note
------+-----+-----
apple |   3 |  🍎
kiwi  |  12 | a|b"""


def test_sample_as_telegram_html() -> None:
    html = to_telegram_html(SAMPLE)
    assert html == f"""<b>Results for &lt;b&gt; &amp; "friends"</b>

Prices went <b>up</b> by <i>5%</i>, <s>down</s> never; see \
<a href="https://example.com/r?a=1&amp;b=2">the report</a> or <code>x &lt; y</code>.

• apples
  ◦ green &amp; red
    1. first
    2. second
• pears

<blockquote>Keep <b>calm</b>
and carry on.</blockquote>

<pre>{_TABLE_TEXT}</pre>

<pre><code class="language-python">if a &lt; b and c &gt; d:
    print("&amp;")</code></pre>"""
    visible, entities = parse_entities(html, "HTML")
    assert visible == telegram_text(html) and utf16_len(visible) == telegram_length(SAMPLE)
    kinds = [e["type"] for e in entities]
    assert kinds == ["bold", "bold", "italic", "strikethrough", "text_link", "code", "blockquote", "bold", "pre",
                     "pre"]
    assert entities[-1]["language"] == "python" and entities[4]["url"] == "https://example.com/r?a=1&b=2"


def test_sample_as_slack_mrkdwn() -> None:
    assert to_mrkdwn(SAMPLE) == f"""*Results for &lt;b&gt; &amp; "friends"*

Prices went *up* by _5%_, ~down~ never; see <https://example.com/r?a=1&amp;b=2|the report> or `x &lt; y`.

• apples
  ◦ green &amp; red
    1. first
    2. second
• pears

> Keep *calm*
> and carry on.

```
{_TABLE_TEXT}
```

```
if a &lt; b and c &gt; d:
    print("&amp;")
```"""


def test_sample_on_discord_is_the_markdown_with_the_table_as_a_code_block() -> None:
    before, _, rest = SAMPLE.partition("| fruit")
    after = rest[rest.index("```python"):]
    assert to_discord(SAMPLE) == f"{before}```\n{_TABLE_TEXT}\n```\n\n{after}"
    assert to_discord("no tables | here") == "no tables | here"
    assert to_discord("> | a | b |\n> |---|---|\n> | 1 | 2 |") == "> ```\n> a | b\n> --+--\n> 1 | 2\n> ```"


@pytest.mark.parametrize(("markdown", "html"), [
    ("plain text", "plain text"),
    ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
    ("**bold**, __bold__, *it*, _it_, ~~gone~~", "<b>bold</b>, <b>bold</b>, <i>it</i>, <i>it</i>, <s>gone</s>"),
    ("snake_case_name and 2 * 3 * 4", "snake_case_name and 2 * 3 * 4"),
    ("`x < y` and ``a ` b``", "<code>x &lt; y</code> and <code>a ` b</code>"),
    ("**not `code**` here**", "<b>not <code>code**</code> here</b>"),
    ("# Title\ntext", "<b>Title</b>\n\ntext"),
    ("3. three\n4. four", "3. three\n4. four"),
    ("before\n```\nno language\n```\nafter", "before\n\n<pre>no language</pre>\n\nafter"),
    ("```sh\nnot closed yet <", '<pre><code class="language-sh">not closed yet &lt;</code></pre>'),
    # split_message closes a part cut inside a code block with ``` right after its last character
    ("```js\nsplit mid-line```", '<pre><code class="language-js">split mid-line</code></pre>'),
    ("```bad\"lang\nx\n```", "<pre>x</pre>"),
    ('[docs](https://x.org/a?b=1&c="2")', '<a href="https://x.org/a?b=1&amp;c=%222%22">docs</a>'),
    ("[**bold _link_**](http://x.y)", '<a href="http://x.y"><b>bold <i>link</i></b></a>'),
    ("[relative](docs/a.md), [empty]() and [js](javascript:alert(1))",
     "relative, empty and [js](javascript:alert(1))"),
    ("![a chart](https://x.y/c.png) and [![](https://x.y/i.png)](https://x.y)",
     '<a href="https://x.y/c.png">a chart</a> and <a href="https://x.y/i.png">🖼</a>'),
    ("<https://x.y/?a&b>", '<a href="https://x.y/?a&amp;b">https://x.y/?a&amp;b</a>'),
    ("**unclosed bold and *unclosed italic", "**unclosed bold and *unclosed italic"),
    (r"\*literal\* and \_too\_", "*literal* and _too_"),
    ("a ||secret **plan**|| b, not || this ||", "a <tg-spoiler>secret <b>plan</b></tg-spoiler> b, not || this ||"),
    ("||opening spoiler|| then text", "<tg-spoiler>opening spoiler</tg-spoiler> then text"),  # not a table row
    # Code spans bind tighter: a "||" inside one neither closes a spoiler nor loses the span's text.
    ("||`||![i](http://x/i.png)`", "||<code>||![i](http://x/i.png)</code>"),
    ("||`a||b` c||", "<tg-spoiler><code>a||b</code> c</tg-spoiler>"),
    ("||[||](http://x.y)", '||<a href="http://x.y">||</a>'),  # a "||" inside a link's text: the link wins
    ("> > nested\n> quote", "<blockquote>nested\nquote</blockquote>"),
    ("***", "———"),
    ("<b>raw html</b>", "&lt;b&gt;raw html&lt;/b&gt;"),
])
def test_telegram_html(markdown: str, html: str) -> None:
    assert to_telegram_html(markdown) == html
    parse_entities(html, "HTML")  # Telegram accepts it


def test_long_quotes_are_expandable_on_telegram() -> None:
    short, long = "> a short quote", "\n".join(f"> line {i}" for i in range(12))
    assert to_telegram_html(short) == "<blockquote>a short quote</blockquote>"
    html = to_telegram_html(long)
    assert html.startswith("<blockquote expandable>line 0\n") and html.endswith("line 11</blockquote>")
    assert [e["type"] for e in parse_entities(html, "HTML")[1]] == ["expandable_blockquote"]


def test_a_part_starting_inside_a_table_continues_it_without_a_header() -> None:
    rows = "| pear | 7 |\n| fig & date | 10 |\n\nafter"
    assert to_telegram_html(rows) == "<pre>pear       | 7\nfig &amp; date | 10</pre>\n\nafter"
    assert to_mrkdwn(rows) == "```\npear       | 7\nfig &amp; date | 10\n```\n\nafter"
    assert to_discord(rows) == "```\npear       | 7\nfig & date | 10\n```\n\nafter"
    assert to_telegram_html("| just | a line with pipes |") == "<pre>just | a line with pipes</pre>"


@pytest.mark.parametrize(("markdown", "mrkdwn"), [
    ("**bold**, __bold__, *italic*, _italic_, ~~gone~~", "*bold*, *bold*, _italic_, _italic_, ~gone~"),
    ("***both***", "_*both*_"),
    ("[the docs](https://example.com/a?b=1&c=2)", "<https://example.com/a?b=1&amp;c=2|the docs>"),
    ("see <https://example.com> and ![chart](https://example.com/c.png)",
     "see <https://example.com> and <https://example.com/c.png|chart>"),
    ("[a|b > c](https://x.io/p|q)", "<https://x.io/p%7Cq|a|b &gt; c>"),
    ("[relative](docs/a.md)", "relative"),
    ("if a < b && c > d", "if a &lt; b &amp;&amp; c &gt; d"),
    ("<!channel> <@U123> <script>", "&lt;!channel&gt; &lt;@U123&gt; &lt;script&gt;"),
    ("`**not bold** <x>`", "`**not bold** &lt;x&gt;`"),
    ("```python\nprint(a < b)  # **kept**\n```\n**after**", "```\nprint(a &lt; b)  # **kept**\n```\n\n*after*"),
    ("# Title\n## Sub **title**", "*Title*\n\n*Sub title*"),
    ("- one\n- two\n  + nested\n\n1. first", "• one\n• two\n  ◦ nested\n\n1. first"),
    ("> quoted **text**\n>\n> more", "> quoted *text*\n>\n> more"),
    ("2 * 3 * 4 and snake_case_name", "2 * 3 * 4 and snake_case_name"),
    ("plain text", "plain text"),
])
def test_slack_mrkdwn(markdown: str, mrkdwn: str) -> None:
    assert to_mrkdwn(markdown) == mrkdwn


# --------------------------------------------------------------------------- any Markdown

_PIECES = st.sampled_from([
    *"ab *_~`[]()\n\\<>&#\"'|-:😀", "word", "Wörd", "```", "```py\n", "](http://x.y)", "**", "https://a.b", "||",
    "\n\n", "# ", "- ", "  - ", "1. ", "> ", "| a | b |\n", "|---|:-:|\n", "![i](http://x/i.png)", "<http://a.b>",
    "&amp;", "    ",
])
_REFERENCE = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


class _Text(HTMLParser):
    """The text of HTML, image descriptions included."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.parts.append(dict(attrs).get("alt") or "")


def _letters(text: str) -> str:
    return "".join(re.findall(r"[^\W\d_]", text))


def _reference_letters(markdown: str) -> str:
    """The letters a CommonMark + GFM renderer shows for ``markdown``, in order."""
    parser = _Text()
    parser.feed(_REFERENCE.render(markdown))
    parser.close()
    return _letters("".join(parser.parts))


@settings(max_examples=500, deadline=None)
@given(st.lists(_PIECES, max_size=40).map("".join))
def test_any_markdown_is_accepted_by_telegram_and_keeps_its_words(markdown: str) -> None:
    html = to_telegram_html(markdown)
    visible, _ = parse_entities(html, "HTML")  # the simulator's port of Telegram's parser: raises if rejected
    assert visible == telegram_text(html)
    assert _letters(visible) == _reference_letters(markdown)


_OUR_LINK = re.compile(r"<(?:https?|tg|mailto):[^\s<>|]*(?:\|[^<>]*)?>")
_QUOTE_MARK = re.compile(r"^[ •◦▪\d.]*>(?: |$)", re.MULTILINE)  # a quote, maybe in a list item


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=40).map("".join))
def test_any_markdown_as_mrkdwn_has_no_control_sequences_but_our_links(markdown: str) -> None:
    rest = _QUOTE_MARK.sub("", _OUR_LINK.sub("", to_mrkdwn(markdown)))
    assert "<" not in rest and ">" not in rest
    assert re.sub(r"&(?:amp|lt|gt);", "", rest).count("&") == 0


def test_rendering_hostile_input_stays_fast() -> None:
    started = time.perf_counter()
    for hostile in ("[" * 4096, "*a " * 1365, "_" * 4096, "`" * 4096, "[a](" * 1024, "**x " * 1024, "|" * 4096,
                    "> " * 2048, "- " * 2048, "||a " * 1024):
        parse_entities(to_telegram_html(hostile), "HTML")
        to_mrkdwn(hostile)
        to_discord(hostile)
    assert time.perf_counter() - started < 3.0


# --------------------------------------------------------------------------- end to end, long answers

_CODE = "\n".join(f"    value_{i} = compute({i}) < limit && ok  # step {i}" for i in range(150))
_ROWS = "\n".join(f"| item {i} | {i * i} | note <{i}> & more |" for i in range(150))
LONG = (f"# Report\n\nIntro **text**.\n\n```python\n{_CODE}\n```\n\n| name | square | note |\n|---|--:|---|\n"
        f"{_ROWS}\n\nThe end.")


def _parts(adapter: BasePlatformAdapter, markdown: str) -> list[str]:
    """The parts the gateway hands the adapter (gateway/runs.py splits exactly so)."""
    return split_message(markdown, adapter.max_message_length, adapter.length_fn)


def _assert_everything_shown(shown: str) -> None:
    for i in range(150):
        assert f"value_{i} = compute({i}) < limit && ok  # step {i}" in shown
        assert re.search(rf"item {i} +\| +{i * i} +\| note <{i}> & more", shown), i
    assert "Report" in shown and "The end." in shown


async def _inbox(event: MessageEvent) -> Accepted | None:
    return None


async def test_long_answer_reaches_telegram_as_valid_html_parts_within_the_limit() -> None:
    async with TelegramSimulator() as sim:
        sim.add_chat(DEFAULT_USER_ID)
        adapter = TelegramAdapter(TelegramSettings(token=sim.token, base_url=sim.base_url,
                                                   base_file_url=sim.base_file_url))
        await adapter.connect(_inbox, receive=False)
        try:
            parts = _parts(adapter, LONG + "\n\n" + SAMPLE)
            assert len(parts) > 3
            for part in parts:
                assert (await adapter.send(str(DEFAULT_USER_ID), part)).success
        finally:
            await adapter.disconnect()
        sent = sim.sent_messages(DEFAULT_USER_ID)
        assert [s.parse_mode for s in sent] == ["HTML"] * len(parts)  # no plain-text fallback was needed
        assert all(s.call.status == 200 and 0 < utf16_len(s.text or "") <= MAX_TEXT_LENGTH for s in sent)
        assert max(utf16_len(s.text or "") for s in sent) > MAX_TEXT_LENGTH - 200  # parts are filled
        for s in sent:  # a code block cut across parts is closed and reopened, with its language
            entities = s.result.get("entities", [])
            if "value_" in (s.text or "").split("\n")[-1]:
                assert entities[-1]["type"] == "pre" and entities[-1].get("language") == "python"
        _assert_everything_shown("\n".join(s.text or "" for s in sent))
        assert to_telegram_html(SAMPLE) in (sent[-1].raw_text or "")


async def test_long_answer_reaches_slack_as_mrkdwn_parts_within_the_limit() -> None:
    async with SlackSimulator() as sim:
        adapter = SlackAdapter(SlackSettings(bot_token=sim.bot_token, app_token=sim.app_token,
                                             signing_secret=sim.signing_secret, api_base_url=sim.base_url))
        await adapter.connect(_inbox, receive=False)
        try:
            parts = _parts(adapter, LONG)
            for part in parts:
                assert (await adapter.send(DEFAULT_CHANNEL, part)).success
        finally:
            await adapter.disconnect()
        texts = [m.text for m in sim.messages(DEFAULT_CHANNEL)]
        assert texts == [to_mrkdwn(p) for p in parts] and len(texts) > 2
        assert all(len(t) <= MAX_PART_LENGTH == 4000 for t in texts)
        assert all(t.count("```") % 2 == 0 for t in texts)  # every code block closed within its part
        assert not any(_OUR_LINK.sub("", t).count("<") for t in texts)
        _assert_everything_shown("\n".join(texts).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


@pytest.fixture
def _discord_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter sets discord.py's process-wide URLs; put them back after the test."""
    monkeypatch.setattr(Route, "BASE", Route.BASE)
    monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", DiscordWebSocket.DEFAULT_GATEWAY)


@pytest.fixture
async def discord_sim(_discord_endpoints: None) -> AsyncIterator[DiscordSimulator]:
    async with DiscordSimulator() as sim:
        yield sim


async def test_long_answer_reaches_discord_with_tables_as_code_blocks(discord_sim: DiscordSimulator) -> None:
    adapter = DiscordAdapter(DiscordSettings(token=discord_sim.token, api_base_url=discord_sim.api_base_url,
                                             gateway_url=discord_sim.gateway_url))
    await adapter.connect(_inbox, receive=False)
    try:
        chat = discord_sim.dm_channel_id()
        parts = _parts(adapter, LONG)
        for part in parts:
            assert (await adapter.send(str(chat), part)).success
    finally:
        await adapter.disconnect()
    contents = [m["content"] for m in discord_sim.bot_messages(chat)]
    assert contents == [to_discord(p) for p in parts] and len(contents) > 5
    assert all(utf16_len(c) <= 2000 for c in contents)
    assert all(c.count("```") % 2 == 0 for c in contents)
    assert not any(line.startswith("|") for c in contents for line in c.split("\n"))  # no raw table rows
    _assert_everything_shown("\n".join(contents))


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=60).map("".join))
@example("bbbb|---|---|\n# aaaa1. aaaa1. \n___- bba\n\n1. aaaa` |---|---|\n`aaaaaaaaaaaa[x](http://y.z)1. `- "
         "aaaa| a | b |\n")
def test_every_part_fits_once_rendered_though_rendering_can_shrink_as_text_grows(markdown: str) -> None:
    """``**a b**`` shows 3 characters, its prefix ``**a b`` 5: split_message re-measures the part it chose."""
    for part in split_message(markdown, 16, telegram_length):
        assert telegram_length(part) <= 16
