"""The SSE parser against each WHATWG event-stream rule, plus a framing-invariance property."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_bos.exceptions import BosEventTooLarge, BosSseError
from airflow_provider_bos.mcp.sse import SseEvent, SseParser, iter_sse

PROFILE = settings(settings.get_profile(os.environ.get("BOS_HYPOTHESIS_PROFILE", "bos-ci")))


def parse(*chunks: bytes, **kwargs: object) -> list[SseEvent]:
    parser = SseParser(**kwargs)  # type: ignore[arg-type]
    events: list[SseEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return events


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


# --- line breaks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_each_line_ending_frames_events(eol: bytes) -> None:
    stream = b"event: a" + eol + b"data: 1" + eol + eol + b"data: 2" + eol + eol
    assert parse(stream) == [SseEvent("a", "1"), SseEvent("message", "2")]


def test_mixed_line_endings_in_one_stream() -> None:
    assert parse(b"data: a\r\ndata: b\rdata: c\n\r\n") == [SseEvent("message", "a\nb\nc")]


def test_crlf_split_across_chunks_is_one_line_break() -> None:
    # Were the LF a second break, it would be a blank line dispatching "a" alone.
    assert parse(b"data: a\r", b"\ndata: b\r\n\r\n") == [SseEvent("message", "a\nb")]


def test_cr_at_chunk_end_followed_by_other_data_still_breaks() -> None:
    assert parse(b"data: a\r", b"\r") == [SseEvent("message", "a")]


def test_cr_then_empty_chunk_then_lf_is_one_break() -> None:
    assert parse(b"data: a\r", b"", b"\ndata: b\n\n") == [SseEvent("message", "a\nb")]


def test_every_byte_in_its_own_chunk() -> None:
    stream = b"\xef\xbb\xbfevent: x\r\ndata: h\xc3\xa9llo\r\n: c\r\nid: 7\r\r\n"
    assert parse(*bytewise(stream)) == [SseEvent("x", "héllo", id="7")]


# --- BOM and UTF-8 --------------------------------------------------------------------------------


def test_one_leading_bom_is_stripped() -> None:
    assert parse(b"\xef\xbb\xbfdata: x\n\n") == [SseEvent("message", "x")]


def test_bom_split_over_chunks_is_stripped() -> None:
    assert parse(b"\xef", b"\xbb", b"\xbfdata: x\n\n") == [SseEvent("message", "x")]


def test_only_one_bom_is_stripped() -> None:
    # The second BOM becomes part of the field name "\ufeffdata", an unknown field: ignored.
    assert parse(b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n") == []


def test_bom_later_in_the_stream_is_data() -> None:
    assert parse(b"data: \xef\xbb\xbfx\n\n") == [SseEvent("message", "\ufeffx")]


def test_short_stream_that_only_looks_like_a_bom_start() -> None:
    assert parse(b"\xef", b"") == []


def test_multibyte_character_split_across_chunks() -> None:
    euro = "€".encode()
    assert parse(b"data: " + euro[:1], euro[1:2], euro[2:] + b"\n\n") == [SseEvent("message", "€")]


def test_invalid_utf8_is_replaced_by_default() -> None:
    parser = SseParser()
    events = parser.feed(b"data: a\xffb\n\n")
    assert events == [SseEvent("message", "a\ufffdb")]
    assert parser.invalid_utf8_lines == 1


def test_invalid_utf8_can_be_an_error() -> None:
    parser = SseParser(invalid_utf8="error")
    with pytest.raises(BosSseError, match="not valid UTF-8"):
        parser.feed(b"data: a\xffb\n\n")
    with pytest.raises(BosSseError, match="already failed"):
        parser.feed(b"data: ok\n\n")


# --- fields -----------------------------------------------------------------------------------------


def test_comments_are_ignored() -> None:
    assert parse(b": bos/source-results/v1\n:keepalive\n\ndata: x\n: mid-event\n\n") == [SseEvent("message", "x")]


def test_field_without_colon_has_empty_value() -> None:
    assert parse(b"data\n\n") == [SseEvent("message", "")]
    assert parse(b"data\ndata\n\n") == [SseEvent("message", "\n")]


def test_only_one_leading_space_is_removed() -> None:
    assert parse(b"data:x\n\ndata: x\n\ndata:  x\n\n") == [
        SseEvent("message", "x"),
        SseEvent("message", "x"),
        SseEvent("message", " x"),
    ]


def test_value_keeps_later_colons() -> None:
    assert parse(b'data: {"a":"b:c"}\n\n') == [SseEvent("message", '{"a":"b:c"}')]


def test_data_lines_join_with_newline_and_no_trailing_newline() -> None:
    assert parse(b"data: a\ndata:\ndata: c\n\n") == [SseEvent("message", "a\n\nc")]


def test_blank_line_without_data_does_not_dispatch_and_resets_event_name() -> None:
    assert parse(b"event: ping\n\ndata: x\n\n") == [SseEvent("message", "x")]


def test_event_name_defaults_to_message_and_can_be_set() -> None:
    assert parse(b"data: 1\n\nevent: custom\ndata: 2\n\n") == [SseEvent("message", "1"), SseEvent("custom", "2")]


def test_empty_event_name_means_message() -> None:
    assert parse(b"event:\ndata: 1\n\n") == [SseEvent("message", "1")]


def test_last_event_id_persists_across_events() -> None:
    events = parse(b"id: 1\ndata: a\n\ndata: b\n\nid\ndata: c\n\n")
    assert [e.id for e in events] == ["1", "1", ""]


def test_id_containing_nul_is_ignored() -> None:
    assert parse(b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n")[1].id == "1"


def test_id_only_block_sets_the_id_without_dispatching() -> None:
    assert parse(b"id: 9\n\ndata: a\n\n") == [SseEvent("message", "a", id="9")]


def test_retry_accepts_only_ascii_digits() -> None:
    events = parse(b"retry: 1500\ndata: a\n\nretry: 12a\ndata: b\n\nretry: \xd9\xa3\ndata: c\n\n")
    assert [e.retry for e in events] == [1500, 1500, 1500]


def test_priming_event_is_an_empty_event_with_id_and_retry() -> None:
    # MCP 2025-11-25 (SEP-1699): a response stream may open with an id, empty data and retry.
    parser = SseParser()
    events = parser.feed(b"id: s7.0\ndata: \nretry: 500\n\nid: s7.1\ndata: {}\n\n")
    assert events == [SseEvent("message", "", id="s7.0", retry=500),
                      SseEvent("message", "{}", id="s7.1", retry=500)]
    assert [e.empty for e in events] == [True, False]
    assert (parser.last_event_id, parser.retry) == ("s7.1", 500)


def test_empty_raw_data_event_is_empty_but_a_streamed_one_is_not() -> None:
    assert parse(b"id: 1\ndata:\n\n", raw_data=True) == [SseEvent("message", b"", id="1")]
    assert parse(b"id: 1\ndata:\n\n", raw_data=True)[0].empty
    assert not SseEvent("message", "", streamed=True).empty


def test_retry_takes_effect_before_the_blank_line() -> None:
    parser = SseParser()
    parser.feed(b"retry: 2000\n")
    assert parser.retry == 2000


def test_last_event_id_is_only_taken_at_the_blank_line() -> None:
    # A stream cut inside event 2 must resume after event 1, so event 2 is sent again.
    parser = SseParser()
    parser.feed(b"id: 1\ndata: a\n\nid: 2\ndata: {\"partial")
    assert parser.last_event_id == "1"
    parser.close()
    assert parser.last_event_id == "1"


def test_last_event_id_of_a_streamed_event_is_only_taken_at_its_blank_line() -> None:
    sunk: list[bytes] = []
    parser = SseParser(stream_threshold=0, open_stream=lambda: _Sink(sunk))
    events = parser.feed(b"id: 1\ndata: a\n\nid: 2\ndata: bbbb")
    assert [e.id for e in events] == ["1"] and parser.last_event_id == "1"
    assert parser.feed(b"bb\n\n")[0].id == "2" and parser.last_event_id == "2"


def test_id_only_block_sets_the_last_event_id_at_its_blank_line() -> None:
    parser = SseParser()
    assert parser.feed(b"id: 9\n") == [] and parser.last_event_id is None
    assert parser.feed(b"\n") == [] and parser.last_event_id == "9"


def test_an_empty_event_is_never_streamed_but_a_later_data_byte_starts_the_stream() -> None:
    sunk: list[bytes] = []
    parser = SseParser(stream_threshold=0, open_stream=lambda: _Sink(sunk), raw_data=True)
    events = parser.feed(b"id: 1\ndata: \nretry: 9\n\ndata:\ndata: x\n\n")
    assert events[0] == SseEvent("message", b"", id="1", retry=9) and events[0].empty
    assert events[1].streamed and not events[1].empty and sunk == [b"\nx"]


def test_comments_are_counted_as_activity_without_events() -> None:
    parser = SseParser()
    assert parser.feed(b": bos/source-results/v1\n\n: keepalive\n\n:\n") == []
    assert parser.comments == 3


def test_comments_inside_a_streamed_event_are_counted() -> None:
    sunk: list[bytes] = []
    parser = SseParser(stream_threshold=0, open_stream=lambda: _Sink(sunk))
    events = parser.feed(b"data: {\"a\":\n: keepalive\ndata: 1}\n\n")
    assert [e.streamed for e in events] == [True] and sunk == [b'{"a":\n1}']
    assert parser.comments == 1


def test_unknown_fields_are_ignored() -> None:
    assert parse(b"foo: bar\ndata: x\nDATA: y\n\n") == [SseEvent("message", "x")]


# --- EOF and limits ---------------------------------------------------------------------------------


def test_incomplete_event_at_eof_is_discarded() -> None:
    assert parse(b"data: a\n\ndata: b\n") == [SseEvent("message", "a")]
    assert parse(b"data: a\n\ndata: b") == [SseEvent("message", "a")]


def test_feed_after_close_is_an_error() -> None:
    parser = SseParser()
    parser.close()
    with pytest.raises(BosSseError):
        parser.feed(b"data: x\n\n")


def test_event_at_the_limit_passes_and_one_byte_more_fails() -> None:
    line = b"data: " + b"x" * 94  # 100 bytes of retained line
    assert parse(line + b"\n\n", max_event_bytes=100) == [SseEvent("message", "x" * 94)]
    with pytest.raises(BosEventTooLarge):
        parse(line + b"x\n\n", max_event_bytes=100)


def test_limit_counts_all_data_lines_of_one_event() -> None:
    with pytest.raises(BosEventTooLarge):
        parse(b"data: 12345\n" * 20 + b"\n", max_event_bytes=200)
    # ... but not across events.
    assert len(parse(b"data: 12345\n\n" * 20, max_event_bytes=20)) == 20


def test_endless_line_without_newline_is_cut_off_with_bounded_memory() -> None:
    parser = SseParser(max_event_bytes=1_000_000)
    chunk = b"x" * 65536
    with pytest.raises(BosEventTooLarge) as excinfo:
        for _ in range(100):
            parser.feed(chunk)
            assert parser.buffered_bytes <= 1_000_000
    assert excinfo.value.limit == 1_000_000
    assert parser.buffered_bytes == 0


def test_huge_comment_lines_do_not_accumulate() -> None:
    # A terminated comment line is dropped at once; only an unterminated line is held.
    parser = SseParser(max_event_bytes=100)
    for _ in range(50):
        assert parser.feed(b": " + b"k" * 60 + b"\n") == []
    assert parser.feed(b"data: ok\n\n") == [SseEvent("message", "ok")]


def test_iter_sse_is_lazy_and_in_order() -> None:
    chunks = iter([b"data: 1\n\nda", b"ta: 2\n", b"\ndata: 3\n"])
    assert list(iter_sse(chunks)) == [SseEvent("message", "1"), SseEvent("message", "2")]


def test_large_single_line_in_chunks() -> None:
    payload = b"y" * (3 * 65536 + 17)
    stream = b"data: " + payload + b"\r\n\r\n"
    chunks = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
    assert parse(*chunks) == [SseEvent("message", payload.decode())]


# --- property: framing never changes the events ----------------------------------------------------

_text_no_breaks = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=20
)
_name = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters=":"),
                min_size=1, max_size=8)


@st.composite
def _event_specs(draw: st.DrawFn) -> list[dict]:
    """Blocks to send: dispatching events, or data-less blocks that only set id/retry/event."""
    blocks = []
    for _ in range(draw(st.integers(0, 6))):
        blocks.append(
            {
                "data": draw(st.one_of(st.none(), st.lists(_text_no_breaks, min_size=1, max_size=4))),
                "event": draw(st.one_of(st.none(), _name)),
                "id": draw(st.one_of(st.none(), _text_no_breaks.filter(lambda s: "\x00" not in s))),
                "retry": draw(st.one_of(st.none(), st.integers(0, 10**6))),
            }
        )
    return blocks


def _expected(blocks: list[dict]) -> list[SseEvent]:
    events, last_id, retry = [], None, None
    for block in blocks:
        if block["id"] is not None:
            last_id = block["id"]
        if block["retry"] is not None:
            retry = block["retry"]
        if block["data"] is not None:
            events.append(SseEvent(block["event"] or "message", "\n".join(block["data"]), last_id, retry))
    return events


@st.composite
def _serialised(draw: st.DrawFn) -> tuple[list[dict], bytes]:
    blocks = draw(_event_specs())
    lines: list[str] = []
    for block in blocks:
        fields: list[str] = []
        for data in block["data"] or []:
            if data == "" and draw(st.booleans()):
                fields.append("data")  # field without a colon
            else:
                space = " " if data.startswith(" ") or draw(st.booleans()) else ""
                fields.append(f"data:{space}{data}")
        if block["event"] is not None:
            fields.append(f"event: {block['event']}")
        if block["id"] is not None:
            space = " " if block["id"].startswith(" ") or draw(st.booleans()) else ""
            fields.append(f"id:{space}{block['id']}")
        if block["retry"] is not None:
            fields.append(f"retry: {block['retry']}")
        # The data lines keep their order; other fields may go anywhere.
        order = draw(st.permutations(range(len(fields))))
        data_positions = sorted(i for i in order if fields[i].startswith("data"))
        non_data = [i for i in order if not fields[i].startswith("data")]
        slots = draw(st.permutations(["d"] * len(data_positions) + ["n"] * len(non_data)))
        d_iter, n_iter = iter(data_positions), iter(non_data)
        for slot in slots:
            lines.append(fields[next(d_iter) if slot == "d" else next(n_iter)])
            if draw(st.integers(0, 5)) == 0:
                lines.append(":" + draw(_text_no_breaks))  # a comment anywhere
        lines.append("")  # the blank line that ends the block
    out = bytearray(b"\xef\xbb\xbf" if draw(st.booleans()) else b"")
    previous_eol = ""
    for line in lines:
        choices = ["\n", "\r", "\r\n"]
        if previous_eol == "\r" and line == "":
            choices = ["\r", "\r\n"]  # a bare LF here would merge into the previous CR
        eol = draw(st.sampled_from(choices))
        out += line.encode("utf-8") + eol.encode()
        previous_eol = eol
    return blocks, bytes(out)


@PROFILE
@given(_serialised(), st.data())
def test_any_valid_framing_and_chunking_parses_to_the_same_events(
    case: tuple[list[dict], bytes], data: st.DataObject
) -> None:
    blocks, stream = case
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert parse(*chunks) == _expected(blocks)


@PROFILE
@given(st.lists(st.binary(max_size=64), max_size=10))
def test_arbitrary_bytes_yield_events_or_a_bos_error(chunks: list[bytes]) -> None:
    parser = SseParser(max_event_bytes=256)
    try:
        for chunk in chunks:
            for event in parser.feed(chunk):
                assert isinstance(event.data, str)
        parser.close()
    except BosSseError:
        pass


class _Sink:
    def __init__(self, out: list[bytes]) -> None:
        self._out = out
        self._data = bytearray()

    def write(self, data: bytes) -> None:
        self._data += data

    def end(self) -> None:
        self._out.append(bytes(self._data))


@PROFILE
@given(_serialised(), st.data())
def test_streamed_events_carry_the_same_data_under_any_framing_and_chunking(
    case: tuple[list[dict], bytes], data: st.DataObject
) -> None:
    # stream_threshold=0: every data event goes to a sink, through the streaming line reader.
    blocks, stream = case
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    sunk: list[bytes] = []
    parser = SseParser(stream_threshold=0, open_stream=lambda: _Sink(sunk))
    events: list[SseEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    expected = _expected(blocks)
    assert [e.event for e in events] == [e.event for e in expected]
    # An event is streamed once its data starts; its data then arrives through the sink.
    got = iter(sunk)
    for event, want in zip(events, expected, strict=True):
        assert (next(got).decode("utf-8", "replace") if event.streamed else event.data) == want.data
