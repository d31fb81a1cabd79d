"""The examples docs/PROTOCOL.md shows, held to the server: the sketch of STATUS_REPLY (every
field where the sketch puts it, of the sketch's JSON type) and the RESERVE with AFTER byte by
byte (the request is what the document's layout encodes, the reply a BLOCK that sorts after
the token, and the real server answers that very request so)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import sfwire

DOC = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"


def section(title: str) -> str:
    """The text of one ``##``/``###`` section of the document, up to the next heading of any level."""
    text = DOC.read_text()
    start = text.index(title)
    end = re.search(r"^#{2,3} ", text[start + len(title) :], re.M)
    return text[start : start + len(title) + (end.start() if end else len(text))]


def code_blocks(text: str, lang: str = "") -> list[str]:
    return re.findall(r"^```" + lang + r"\n(.*?)^```", text, re.S | re.M)


# -- the STATUS_REPLY sketch -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def sketch() -> dict:
    [block] = code_blocks(section("### STATUS (0x02) and STATUS_REPLY (0x82)"), "json")
    return json.loads(block)


def kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def where(sketch_value, real_value, path: str, missing: list[str]) -> None:
    """Every key of the sketch is in the real reply, at the same place; where both are not
    null, of the same JSON type (lists: their first entries, when the real one has any)."""
    if sketch_value is None or real_value is None:
        return
    if kind(sketch_value) != kind(real_value):
        missing.append(f"{path}: {kind(real_value)} where the sketch has {kind(sketch_value)}")
        return
    if isinstance(sketch_value, dict):
        for key, value in sketch_value.items():
            if key not in real_value:
                missing.append(f"{path}.{key}")
            else:
                where(value, real_value[key], f"{path}.{key}", missing)
    elif isinstance(sketch_value, list) and sketch_value and real_value:
        where(sketch_value[0], real_value[0], f"{path}[0]", missing)


def test_the_sketch_is_the_documented_shape(sketch):
    assert set(sketch) >= {"version", "software_version", "broker", "layout", "region", "workers"}
    assert sketch["broker"]["own_worker_id"]["slot"] == -1
    assert sketch["broker"]["fast_port"] is not None and sketch["broker"]["own_worker_id"] is not None


#: Where the sketches show every field of the reply (elsewhere, "at least" these fields:
#: the per-worker, per-slot and counter objects grow as diagnostics do).
COMPLETE = {
    "STATUS": ("", ".broker", ".broker.fast_port", ".broker.http_port", ".layout"),
    "NODES": ("", ".nodes[0]"),
}


def at(value, path: str):
    """The value at ``path`` (``.broker.fast_port``, ``.nodes[0]``); {} where there is none."""
    for part in re.findall(r"\.(\w+)|\[(\d+)\]", path):
        try:
            value = value[part[0]] if part[0] else value[int(part[1])]
        except (KeyError, IndexError, TypeError):
            return {}
    return value


def unsketched(sketch: dict, real: dict, paths: tuple[str, ...]) -> list[str]:
    """The keys of the real reply the sketch does not show, at the paths where it shows them all."""
    return [f"{path}.{key}" for path in paths for key in at(real, path) if key not in at(sketch, path)]


@pytest.fixture(scope="module")
def like_the_sketches(start_node, unused_port, tmp_path_factory):
    """A node like the sketches': one worker, its own worker ID, a fast port and an HTTP door;
    its STATUS and NODES replies once its own worker ID is held."""
    args = ("--fast-bind", f"127.0.0.1:{unused_port()}", "--http-bind", f"127.0.0.1:{unused_port()}")
    srv = start_node(tmp_path_factory.mktemp("sketch"), workers=1, args=args)
    try:
        deadline = time.monotonic() + 10
        while (status := srv.status())["broker"]["own_worker_id"] is None or not status["broker"]["own_worker_id"].get(
            "held"
        ):
            assert time.monotonic() < deadline, "the broker claimed no worker ID of its own"
            time.sleep(0.1)
        sock = sfwire.connect(srv.ctx, srv.endpoint)
        try:
            nodes = sfwire.request(sock, sfwire.nodes(srv.request_id())).json
        finally:
            sock.close(0)
        yield status, nodes
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def nodes_sketch() -> dict:
    [block] = code_blocks(section("### NODES (0x04) and NODES_REPLY (0x84)"), "json")
    return json.loads(block)


def test_every_field_of_the_status_sketch_is_where_the_sketch_puts_it(sketch, like_the_sketches):
    status, _ = like_the_sketches
    assert status["broker"]["fast_port"] is not None and status["broker"]["http_port"] is not None
    missing: list[str] = []
    where(sketch, status, "", missing)
    assert missing == [], missing


def test_the_status_sketch_shows_every_field_of_the_reply(sketch, like_the_sketches):
    status, _ = like_the_sketches
    found = unsketched(sketch, status, COMPLETE["STATUS"])
    assert found == [], f"fields of STATUS_REPLY the sketch does not show: {found}"


def test_every_field_of_the_nodes_sketch_is_where_the_sketch_puts_it(nodes_sketch, like_the_sketches):
    _, nodes = like_the_sketches
    # clock_offsets_ms is keyed by the peers' endpoints (the real node has no peers).
    shape = json.loads(json.dumps(nodes_sketch))
    shape["nodes"][0]["clock_offsets_ms"] = {}
    missing: list[str] = []
    where(shape, nodes, "", missing)
    assert missing == [], missing
    found = unsketched(nodes_sketch, nodes, COMPLETE["NODES"])
    assert found == [], f"fields of NODES_REPLY the sketch does not show: {found}"


def test_every_field_of_the_sketches_is_described_in_the_text(sketch, nodes_sketch):
    # Each key the sketches show in full is named in backquotes in its section's prose.
    for title, shown, paths in (
        ("### STATUS (0x02) and STATUS_REPLY (0x82)", sketch, COMPLETE["STATUS"]),
        ("### NODES (0x04) and NODES_REPLY (0x84)", nodes_sketch, COMPLETE["NODES"]),
    ):
        prose = re.sub(r"^```.*?^```", "", section(title), flags=re.S | re.M)
        keys = {key for path in paths for key in at(shown, path)}
        undescribed = sorted(k for k in keys if f"`{k}`" not in prose)
        assert undescribed == [], f"{title}: fields the text does not name: {undescribed}"


def test_the_document_links_the_http_door_and_the_id_forms():
    text = DOC.read_text()
    assert "(HTTP.md)" in text and "(GUIDE.md#id-forms-uuidv7-and-base32)" in text
    curve = section("## Encryption and authentication (CURVE)")
    assert "no HTTP door" in curve and "`http_port` are null" in curve and "--http-bind" in curve


# -- RESERVE with AFTER, byte by byte --------------------------------------------------------------


@pytest.fixture(scope="module")
def example() -> dict[str, bytes]:
    text = section("### RESERVE (0x01)")
    lines = [line for block in code_blocks(text) for line in block.splitlines()]
    out = {}
    for name in ("request", "reply"):
        [line] = [line for line in lines if line.startswith(name + ":")]
        out[name] = bytes.fromhex(line.split(":", 1)[1].replace("|", " "))
    return out


def test_the_example_request_is_a_reserve_with_after(example):
    request = example["request"]
    assert len(request) == 24
    version, type_, flags, request_id, count, after = sfwire.RESERVE_AFTER_BODY.unpack(request)
    assert (version, type_, flags, request_id, count) == (1, sfwire.RESERVE, sfwire.FLAG_AFTER, 43, 10)
    assert request == sfwire.reserve_after(43, 10, after)
    assert after == 121068795149164543 == 0x01AE1F6D80401FFF


def test_the_example_token_is_the_last_id_of_the_block_example_and_the_reply_sorts_after_it(example):
    [block_example] = [
        line for block in code_blocks(section("### BLOCK (0x81)")) for line in block.splitlines() if "|" in line
    ]
    _, _, _, _, first, count = sfwire.BLOCK_BODY.unpack(bytes.fromhex(block_example.replace("|", " ")))
    after = sfwire.RESERVE_AFTER_BODY.unpack(example["request"])[5]
    assert after == first + count - 1
    version, type_, flags, request_id, reply_first, reply_count = sfwire.BLOCK_BODY.unpack(example["reply"])
    assert (version, type_, flags, request_id, reply_count) == (1, sfwire.BLOCK, 0, 43, 10)
    assert reply_first == 121068795153354752 and reply_first > after
    layout = sfwire.Layout(1767225600000, 41, 3, 7, 12)  # the document's default layout
    got, token = layout.decode(reply_first), layout.decode(after)
    assert got.unix_ms == token.unix_ms + 1 and (got.region, got.worker, got.sequence) == (0, 1, 0)


def test_the_server_answers_the_example_request_with_a_block_after_its_token(example, server):
    sock = sfwire.connect(server.ctx, server.endpoint)
    try:
        reply = sfwire.request(sock, example["request"])
    finally:
        sock.close(0)
    first, count = reply.block
    after = sfwire.RESERVE_AFTER_BODY.unpack(example["request"])[5]
    assert reply.request_id == 43 and 1 <= count <= 10 and first > after
