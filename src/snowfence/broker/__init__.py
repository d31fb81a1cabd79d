"""The broker process: the client-facing ROUTER and the supervisor of workers."""
