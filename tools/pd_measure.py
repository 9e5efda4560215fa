"""Driver of tools/pd_ttft.sh: time to first token of one aggregated engine (A) against the two legs of
P/D disaggregation done by hand (prefill leg on P, then the decode leg on D, streamed), fresh random
token-id prompts each time (no prefix hit), A and P/D alternated; and the transfer's bytes and seconds
from D's metrics. The decode leg's TTFT is the time P/D adds to the prefill (pull + one prompt token +
first sample); the prefill leg is the same prompt computed on an engine like A."""
import http.client
import json
import random
import sys
import time
import urllib.parse


def conn(url):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=3600)


def metric(url, name):
    c = conn(url)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def ttft_stream(url, body):
    """Seconds from sending to the first token event of a streamed completion."""
    body = dict(body, stream=True)
    c = conn(url)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"HTTP {r.status}: {r.read()[:300]}")
    first = None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b"data: {") and first is None and b'"choices":[{' in ev:
                first = time.perf_counter() - t0
    return first


def main():
    a, p, d = sys.argv[1:4]
    lens = [int(x) for x in sys.argv[4].split()]
    reps = int(sys.argv[5])
    vocab = int(sys.argv[6])
    rng = random.Random(7)
    for L in lens:
        for rep in range(reps):
            ids = [rng.randrange(1000, vocab) for _ in range(L)]
            t_a = ttft_stream(a, {"prompt": ids, "max_tokens": 2, "ignore_eos": True, "temperature": 0})
            ids = [rng.randrange(1000, vocab) for _ in range(L)]
            c = conn(p)
            t0 = time.perf_counter()
            c.request("POST", "/v1/completions", json.dumps({
                "prompt": ids, "max_tokens": 1, "temperature": 0,
                "kv_transfer_params": {"do_remote_decode": True}}), {"Content-Type": "application/json"})
            r = c.getresponse()
            pj = json.loads(r.read())
            t_p = time.perf_counter() - t0
            b0 = metric(d, "m3serve:kv_transfer_received_bytes_total")
            s0 = metric(d, "m3serve:kv_transfer_seconds_total")
            t_d = ttft_stream(d, {"prompt": ids, "max_tokens": 2, "ignore_eos": True, "temperature": 0,
                                  "kv_transfer_params": pj["kv_transfer_params"]})
            b = metric(d, "m3serve:kv_transfer_received_bytes_total") - b0
            s = metric(d, "m3serve:kv_transfer_seconds_total") - s0
            print(f"{L:6d} tokens: aggregated TTFT {t_a*1e3:9.1f} ms | P/D prefill leg {t_p*1e3:9.1f} ms + decode-leg "
                  f"TTFT {t_d*1e3:7.1f} ms = {(t_p+t_d)*1e3:9.1f} ms | transfer {b/1e6:7.1f} MB in {s*1e3:6.1f} ms "
                  f"= {b/s/1e9 if s else 0:5.2f} GB/s", flush=True)


main()
