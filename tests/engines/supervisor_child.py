"""A tiny stand-in engine for the supervisor tests: `python supervisor_child.py MODE --port N`.

Modes: healthy (503 for a moment, then 200), never (503 forever), exit (logs a load error and
exits 1), oom (logs an out-of-memory line and exits 1 while `-c` is above --fits), ignore-term
(healthy, ignores SIGTERM), grandchild (healthy, starts a sleeping grandchild first), chatty
(prints its argv, `$CHILD_SECRET_TOKEN` and --lines lines of 100 bytes before it serves, then a
line every 10 ms while it serves; it dies, like llama-server, when its output pipe breaks).
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import threading
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("-c", "--ctx-size", type=int, default=0)
    p.add_argument("--fits", type=int, default=0)
    p.add_argument("--lines", type=int, default=4000)
    a, _ = p.parse_known_args()
    print(f"child starting mode={a.mode} ctx={a.ctx_size}", flush=True)
    if a.mode == "exit":
        print("llama_model_load: error loading model: synthetic failure", flush=True)
        sys.exit(1)
    if a.mode == "oom" and a.ctx_size > a.fits:
        print(
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: "
            "cudaMalloc failed: out of memory",
            flush=True,
        )
        sys.exit(1)
    if a.mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.mode == "chatty":
        print("argv: " + " ".join(sys.argv), flush=True)
        print("token: " + os.environ.get("CHILD_SECRET_TOKEN", ""), flush=True)
        for i in range(a.lines):
            print(f"chatter {i:06d} " + "x" * 85, flush=True)

        def chatter() -> None:
            n = 0
            while True:
                try:
                    print(f"serving {n:06d} " + "y" * 85, flush=True)
                except OSError:
                    os._exit(1)  # its output is gone: it ends, as a real engine does
                n += 1
                time.sleep(0.01)

        threading.Thread(target=chatter, daemon=True).start()
    if a.mode == "grandchild":
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"grandchild pid {g.pid}", flush=True)
    ready_at = time.monotonic() + 0.2

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = a.mode != "never" and time.monotonic() >= ready_at
            self.send_response(200 if ok else 503)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    http.server.HTTPServer((a.host, a.port), H).serve_forever()


if __name__ == "__main__":
    main()
