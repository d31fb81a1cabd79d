"""The broker's doors: where client bytes come in and replies go out.

Three siblings, each only moving bytes: the ZeroMQ front (``zmq.py``: the frontend and
backend ROUTER sockets), the fast port (``fast.py``: plain TCP, each body after its
length) and the HTTP door (``http.py``: HTTP/1.1 and JSON). Each hands the requests
it framed to the routing core's one intake (:meth:`snowfence.broker.routing.Routing.requests`)
and writes the replies the core sends back; what a request gets is decided there.
"""
