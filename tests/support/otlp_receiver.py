"""A real OTLP/HTTP trace receiver for dedupd's tests.

It decodes each export with the OpenTelemetry project's own protobuf
definitions (the `opentelemetry-proto` package), not dedupd's code, and
writes every span it got as one JSON line to OUT. The first line on stdout
is the port it listens on (127.0.0.1, chosen by the system).

    python otlp_receiver.py OUT [accept|refuse|hang|redirect]

accept: 200 with an empty ExportTraceServiceResponse; refuse: 503 to
every export; hang: reads nothing and never answers; redirect: 307 to
/v1/traces/followed, where an export that follows it is kept. Each span's
line has the export's `authorization` and `content-encoding` headers (a
gzip body is unpacked).
"""

import gzip
import http.server
import json
import os
import sys
import threading

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]
MODE = sys.argv[2] if len(sys.argv) > 2 else "accept"
LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        if MODE == "hang":
            threading.Event().wait()
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        if MODE == "refuse":
            self.send_response(503)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if MODE == "redirect" and self.path == "/v1/traces":
            # Followed, the export would land on the path below and be kept.
            self.send_response(307)
            self.send_header("location", "/v1/traces/followed")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if self.path not in ("/v1/traces", "/v1/traces/followed") or "protobuf" not in self.headers.get(
            "content-type", ""
        ):
            self.send_response(400)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        encoding = self.headers.get("content-encoding")
        if encoding == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        lines = []
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(
                        json.dumps(
                            {
                                "resource": resource,
                                # What OTEL_EXPORTER_OTLP_HEADERS sent.
                                "authorization": self.headers.get("authorization"),
                                "encoding": encoding,
                                "scope": ss.scope.name,
                                "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(),
                                "parent_span_id": s.parent_span_id.hex(),
                                "name": s.name,
                                "kind": s.kind,
                                "start": s.start_time_unix_nano,
                                "end": s.end_time_unix_nano,
                                "status": s.status.code,
                                "attributes": attributes(s.attributes),
                                "events": [
                                    {"name": e.name, "attributes": attributes(e.attributes)}
                                    for e in s.events
                                ],
                                "links": [
                                    {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
                                    for l in s.links
                                ],
                            }
                        )
                    )
        # One write of whole lines, so a reader never sees half of one.
        if lines:
            data = ("\n".join(lines) + "\n").encode()
            with LOCK:
                fd = os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
