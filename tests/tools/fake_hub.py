#!/usr/bin/env python3
"""A local stand-in for the Hugging Face Hub's HTTP API (stdlib only), for tests without the internet.

Serves checkpoint directories as model repositories with the Hub's request and answer shapes:
  GET  /api/models/ORG/NAME/revision/REV?blobs=true  -> {"id", "sha", "siblings": [{"rfilename", "size",
       "blobId", "lfs": {"sha256", "size", "pointerSize"}}]}  (REV: a branch, or the commit id)
  HEAD|GET /ORG/NAME/resolve/REV/PATH -> small files: 307 to the relative /api/resolve-cache/models/ORG/NAME/
       COMMIT/PATH, which answers 200 with ETag (git blob sha1), X-Repo-Commit;
       *.safetensors (LFS): 302 to /_cdn/SHA256 with X-Linked-Etag (sha256), X-Linked-Size, X-Repo-Commit
  GET  /_cdn/SHA256 -> the bytes, with Range support (206 + Content-Range)
Errors carry X-Error-Code as the Hub's do: RepoNotFound (401), RevisionNotFound (404), EntryNotFound
(404), GatedRepo (401 without a token, 403 with a wrong one).
Test control: POST /_fake/mode with a JSON object merged into the mode:
  {"cut": N}       the next N byte answers send half of what they announce, then close the connection
  {"corrupt": true} byte answers have one byte flipped
  {"match": "S"}   cut and corrupt apply only to requests whose path contains S (e.g. "/_cdn/": LFS files)
  {"down": true}   every API and resolve request answers 503 (a Hub that is unavailable)
GET /_fake/log: the requests so far, [{"method", "path", "range", "auth"}].

Usage: fake_hub.py --port-file FILE --repo ORG/NAME[@BRANCH]=DIR ... [--gated ORG/NAME --token TOKEN]
                   [--tls CERT KEY]
The chosen free port is written to FILE once the server listens. --tls: HTTPS with that certificate
(redirects then point to https:// too).
"""
import argparse
import hashlib
import json
import os
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    """One branch of a repository: its files, their checksums and a commit id made from them."""

    def __init__(self, repo_id, branch, root):
        self.files = {}
        for dirpath, _, names in os.walk(root):
            for n in names:
                full = os.path.join(dirpath, n)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                with open(full, "rb") as f:
                    self.files[rel] = f.read()
        h = hashlib.sha1((repo_id + "@" + branch).encode())
        for rel in sorted(self.files):
            h.update(rel.encode() + hashlib.sha256(self.files[rel]).digest())
        self.commit = h.hexdigest()

    @staticmethod
    def is_lfs(path):
        return path.endswith(".safetensors")


class State:
    def __init__(self):
        self.repos = {}  # repo_id -> {branch: Repo}
        self.blobs = {}  # sha256 -> bytes
        self.gated = set()
        self.tls = False
        self.token = ""
        self.mode = {}
        self.log = []
        self.lock = threading.Lock()

    def find(self, repo_id, rev):
        for branch, r in self.repos.get(repo_id, {}).items():
            if rev in (branch, r.commit):
                return r
        return None


STATE = State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def record(self):
        with STATE.lock:
            STATE.log.append({"method": self.command, "path": self.path, "range": self.headers.get("Range"),
                              "auth": self.headers.get("Authorization")})

    def answer(self, status, body=b"", headers=None, ctype="application/json"):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, code, message):
        self.answer(status, json.dumps({"error": message}).encode(), {"X-Error-Code": code, "X-Error-Message": message})

    def access(self, repo_id):
        """None when the request may see the repository, else (status, code, message)."""
        if repo_id not in STATE.repos:
            return 401, "RepoNotFound", "Repository not found"
        if repo_id in STATE.gated:
            auth = self.headers.get("Authorization")
            if not auth:
                return 401, "GatedRepo", "Access to model %s is restricted. You must have access to it and be authenticated" % repo_id
            if auth != "Bearer " + STATE.token:
                return 403, "GatedRepo", "Access to model %s is restricted and you are not in the authorized list" % repo_id
        return None

    def do_POST(self):
        self.record()
        if self.path == "/_fake/mode":
            n = int(self.headers.get("Content-Length", "0"))
            with STATE.lock:
                STATE.mode.update(json.loads(self.rfile.read(n) or b"{}"))
            return self.answer(200, b"{}")
        self.error(404, "NotFound", "no such endpoint")

    def do_HEAD(self):
        self.route()

    def do_GET(self):
        self.route()

    def route(self):
        self.record()
        path = urlsplit(self.path).path
        if path == "/_fake/log":
            with STATE.lock:
                return self.answer(200, json.dumps(STATE.log).encode())
        if path.startswith("/_cdn/"):
            data = STATE.blobs.get(path[len("/_cdn/"):])
            if data is None:
                return self.error(404, "EntryNotFound", "no such blob")
            return self.send_bytes(data)
        if STATE.mode.get("down"):
            return self.error(503, "", "Service Unavailable")
        parts = [unquote(p) for p in path.split("/")]
        if len(parts) >= 7 and parts[1] == "api" and parts[2] == "models" and parts[5] == "revision":
            return self.revision(parts[3] + "/" + parts[4], "/".join(parts[6:]))
        if len(parts) >= 8 and parts[1:4] == ["api", "resolve-cache", "models"]:
            return self.resolve(parts[4] + "/" + parts[5], parts[6], "/".join(parts[7:]), cached=True)
        if len(parts) >= 6 and parts[3] == "resolve":
            return self.resolve(parts[1] + "/" + parts[2], parts[4], "/".join(parts[5:]))
        self.error(404, "NotFound", "no such endpoint")

    def revision(self, repo_id, rev):
        denied = self.access(repo_id)
        if denied:
            return self.error(*denied)
        r = STATE.find(repo_id, rev)
        if r is None:
            return self.error(404, "RevisionNotFound", "Invalid rev id: " + rev)
        siblings = []
        for rel, data in sorted(r.files.items()):
            s = {"rfilename": rel, "size": len(data), "blobId": git_blob_sha1(data)}
            if Repo.is_lfs(rel):
                s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            siblings.append(s)
        body = {"_id": "fake", "id": repo_id, "modelId": repo_id, "sha": r.commit, "private": False,
                "gated": "manual" if repo_id in STATE.gated else False, "siblings": siblings}
        self.answer(200, json.dumps(body).encode())

    def resolve(self, repo_id, rev, rel, cached=False):
        denied = self.access(repo_id)
        if denied:
            return self.error(*denied)
        r = STATE.find(repo_id, rev)
        if r is None:
            return self.error(404, "RevisionNotFound", "Invalid rev id: " + rev)
        data = r.files.get(rel)
        if data is None:
            return self.error(404, "EntryNotFound", "Entry not found")
        if Repo.is_lfs(rel):
            sha = hashlib.sha256(data).hexdigest()
            host = self.headers.get("Host", "127.0.0.1")
            scheme = "https" if STATE.tls else "http"
            return self.answer(302, b"", {"Location": "%s://%s/_cdn/%s" % (scheme, host, sha), "X-Repo-Commit": r.commit,
                                          "X-Linked-Etag": '"%s"' % sha, "X-Linked-Size": str(len(data)),
                                          "ETag": '"%s"' % git_blob_sha1(b"pointer " + sha.encode())})
        if not cached:  # the Hub sends small files through a relative redirect to its resolve cache
            return self.answer(307, b"", {"Location": "/api/resolve-cache/models/%s/%s/%s" % (repo_id, r.commit, rel),
                                          "X-Repo-Commit": r.commit})
        self.send_bytes(data, {"ETag": '"%s"' % git_blob_sha1(data), "X-Repo-Commit": r.commit})

    def send_bytes(self, data, headers=None):
        headers = dict(headers or {})
        headers["Accept-Ranges"] = "bytes"
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes="):-1])
            if start >= len(data):
                return self.answer(416, b"", {"Content-Range": "bytes */%d" % len(data)})
            status = 206
            headers["Content-Range"] = "bytes %d-%d/%d" % (start, len(data) - 1, len(data))
        body = data[start:]
        with STATE.lock:
            chosen = STATE.mode.get("match", "") in self.path
            corrupt = STATE.mode.get("corrupt") and chosen
            cut = STATE.mode.get("cut", 0) > 0 and self.command == "GET" and chosen
            if cut:
                STATE.mode["cut"] -= 1
        if corrupt and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        if not cut:
            return self.answer(status, body, headers, "application/octet-stream")
        # Announce the whole length, send half, close: a connection lost mid-download.
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--repo", action="append", default=[], help="ORG/NAME[@BRANCH]=DIR")
    ap.add_argument("--gated", action="append", default=[])
    ap.add_argument("--token", default="")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    a = ap.parse_args()
    for spec in a.repo:
        name, root = spec.split("=", 1)
        repo_id, _, branch = name.partition("@")
        r = Repo(repo_id, branch or "main", root)
        STATE.repos.setdefault(repo_id, {})[branch or "main"] = r
        for rel, data in r.files.items():
            if Repo.is_lfs(rel):
                STATE.blobs[hashlib.sha256(data).hexdigest()] = data
    STATE.gated = set(a.gated)
    STATE.token = a.token
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    if a.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.tls[0], a.tls[1])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        STATE.tls = True
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(tmp, a.port_file)  # whole or absent: the test never reads a half-written port
    srv.serve_forever()


if __name__ == "__main__":
    main()
