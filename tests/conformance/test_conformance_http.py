"""The HTTP door, per docs/HTTP.md, from the document alone: where it listens (the host of
the node's ZeroMQ endpoint, on the port STATUS and NODES give), the ``format`` values it
takes (``decimal`` too, the default), and exactly the parameters a JSON body may carry.

One node, bound to ``tcp://127.0.0.1`` with ``--http-bind auto`` (the default); requests
through the standard library's ``http.client``.
"""

from __future__ import annotations

import http.client
import json
import time

import pytest
import sfwire


@pytest.fixture(scope="module")
def node(start_node, tmp_path_factory):
    srv = start_node(tmp_path_factory.mktemp("http"), workers=1, tcp=True)
    try:
        yield srv
    finally:
        srv.kill()


def endpoint_host(node) -> str:
    return node.endpoint.removeprefix("tcp://").rpartition(":")[0]


def call(node, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    port = node.ready_status["broker"]["http_port"]["port"]
    conn = http.client.HTTPConnection(endpoint_host(node), port, timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def test_the_door_listens_on_the_host_of_the_zeromq_endpoint_at_the_port_status_and_nodes_give(node):
    door = node.ready_status["broker"]["http_port"]
    assert door is not None and door["host"] == endpoint_host(node) == "127.0.0.1"
    sock = sfwire.connect(node.ctx, node.endpoint)
    try:
        nodes = sfwire.request(sock, sfwire.nodes(1)).json
    finally:
        sock.close(0)
    assert nodes["http_port"] == door["port"] and [n["http_port"] for n in nodes["nodes"]] == [door["port"]]
    status, answer = call(node, "GET", "/v1/ids")
    assert status == 200 and len(answer["ids"]) == 1


@pytest.mark.parametrize("form, width", [("decimal", None), ("uuid", 36), ("base32", 13)])
def test_every_documented_format_is_taken_decimal_included(node, form, width):
    status, answer = call(node, "GET", f"/v1/ids?count=3&format={form}")
    assert status == 200 and list(answer) == ["ids"] and len(answer["ids"]) == 3, answer
    for text in answer["ids"]:
        assert text.isdigit() if width is None else len(text) == width, text


def test_format_decimal_is_the_default_and_goes_with_blocks(node):
    status, answer = call(node, "GET", "/v1/ids?count=3&format=decimal&blocks=1")
    assert status == 200 and sum(b["count"] for b in answer["blocks"]) == 3, answer
    status, answer = call(node, "GET", "/v1/ids?count=3&format=uuid&blocks=1")
    assert status == 400 and answer["code"] == "bad_request", answer


@pytest.mark.parametrize(
    "body, key, want",
    [
        ({"count": 5}, "ids", 5),
        ({"count": 5, "blocks": True}, "blocks", 5),
        ({"count": 5, "blocks": False}, "ids", 5),
        ({"count": 2, "format": "base32"}, "ids", 2),
        ({"count": 2, "format": "decimal", "blocks": False}, "ids", 2),
        ({}, "ids", 1),
    ],
)
def test_a_json_body_carries_count_blocks_and_format(node, body, key, want):
    status, answer = call(node, "POST", "/v1/ids", json.dumps(body).encode())
    assert status == 200 and list(answer) == [key], answer
    got = sum(b["count"] for b in answer["blocks"]) if key == "blocks" else len(answer["ids"])
    assert got == want


@pytest.mark.parametrize(
    "body",
    [
        b'{"count": "5"}',  # a count is a JSON integer
        b'{"count": 5.0}',
        b'{"count": true}',
        b'{"blocks": 1}',  # blocks is true or false
        b'{"blocks": "true"}',
        b'{"format": 1}',
        b'{"after": "5"}',  # no other name
        b'{"count": 5, "count": 6}',
        b"[5]",  # an object
        b"5",
    ],
)
def test_a_json_body_with_anything_else_is_400(node, body):
    status, answer = call(node, "POST", "/v1/ids", body)
    assert status == 400 and answer["code"] == "bad_request" and answer["retriable"] is False, answer


def test_a_parameter_in_both_the_query_and_the_body_is_400(node):
    status, answer = call(node, "POST", "/v1/ids?count=2", b'{"count": 2}')
    assert status == 400 and answer["code"] == "bad_request", answer


def test_a_json_body_of_1_kib_is_read_and_one_byte_more_is_413(node):
    pad = b'{"count": 2' + b" " * (1024 - len(b'{"count": 2}')) + b"}"
    assert len(pad) == 1024
    assert call(node, "POST", "/v1/ids", pad)[0] == 200
    status, answer = call(node, "POST", "/v1/ids", pad + b" ")
    assert status == 413 and answer["code"] == "frame_too_large", answer


@pytest.mark.parametrize("form", ["uuid", "base32"])
def test_ids_in_a_form_read_back_by_the_guides_rules_to_ids_of_this_node_in_order(node, form):
    status = node.status()
    layout = sfwire.Layout.of(status)
    code, answer = call(node, "GET", f"/v1/ids?count=50&format={form}")
    assert code == 200, answer
    texts = answer["ids"]
    ids = [sfwire.id_of_uuid(t, layout) if form == "uuid" else sfwire.id_of_base32(t) for t in texts]
    assert ids == sorted(set(ids)) and texts == sorted(texts), "one answer's IDs ascend, as text too"
    for id_ in ids:
        d = layout.decode(id_)
        assert d.region == status["region"] and d.worker in sfwire.held_worker_ids(status), d
        assert abs(d.unix_ms - time.time() * 1000) < 60_000, d


@pytest.mark.parametrize(
    "method, path, status",
    [("GET", "/v1/ids", 200), ("GET", "/v1/ids?count=0", 400), ("GET", "/nope", 404), ("DELETE", "/v1/ids", 405)],
)
def test_every_answer_says_no_store_and_an_error_is_json_with_its_status(node, method, path, status):
    port = node.ready_status["broker"]["http_port"]["port"]
    conn = http.client.HTTPConnection(endpoint_host(node), port, timeout=5)
    try:
        conn.request(method, path)
        answer = conn.getresponse()
        body = json.loads(answer.read())
    finally:
        conn.close()
    assert answer.status == status and answer.getheader("Cache-Control") == "no-store", answer.getheaders()
    if status != 200:
        assert body["code"] == "bad_request" and body["retriable"] is False and body["message"], body
    if status == 405:
        assert "GET" in answer.getheader("Allow", ""), answer.getheaders()


def test_pipelined_requests_are_answered_in_the_order_sent(node):
    import socket

    port = node.ready_status["broker"]["http_port"]["port"]
    counts = [7, 1, 4096, 2, 300, 5]
    with socket.create_connection((endpoint_host(node), port), timeout=5) as sock:
        sock.sendall(b"".join(b"GET /v1/ids?count=%d HTTP/1.1\r\nHost: x\r\n\r\n" % n for n in counts))
        reader = sock.makefile("rb")
        got = []
        for _ in counts:
            assert reader.readline().startswith(b"HTTP/1.1 200 ")
            length = None
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            assert length is not None, "every answer has a Content-Length"
            got.append(len(json.loads(reader.read(length))["ids"]))
    assert got == counts
