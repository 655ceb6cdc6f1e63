"""The `secrets` section of scripts/bench/run: a secret door (docs/secrets.md)
against direct HTTPS to the same stand-in model API.

The stand-in is the test world's web server (tests/world_servers/http_server.py)
on this namespace's loopback, HTTPS on 443 with a certificate from a CA made
here (trustme), named api.openai.com in the bench's /etc/hosts; it answers
only with the real key. Two ways, the same client (secret_client.py, Python's
http.client, one kept-alive connection):

  direct HTTPS    the client outside vpnw, TLS to the stand-in itself, with the key
  secret door     the client inside `vpnw run`, plain HTTP to the door with the
                  placeholder; the broker adds the key and opens TLS itself

Figures (medians over the rounds): a small request's time on a kept-alive
connection (p50, p99) and on a new connection; the time to the first byte
of a streamed (SSE) answer; bulk upload and download (MiB/s).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLIENT = os.path.join(HERE, "secret_client.py")
SERVER = os.path.join(ROOT, "tests", "world_servers", "http_server.py")
HOST = "api.openai.com"
DOOR = "http://127.0.0.1:47801"


def start_stand_in(tmp: str, python: str, procs: list) -> str:
    """The stand-in on 127.0.0.1:443 (HTTPS); returns the CA file's path."""
    import trustme
    sys.path.insert(0, os.path.dirname(SERVER))
    import content
    with open("/etc/hosts", "a") as f:     # the bench's own /etc/hosts (a bind in its namespace)
        f.write(f"127.0.0.1 {HOST}\n")
    ca = trustme.CA()
    cert = ca.issue_cert(HOST)
    ca_file = os.path.join(tmp, "secrets-ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    key_file, chain = os.path.join(tmp, "secrets-server.key"), os.path.join(tmp, "secrets-server.pem")
    cert.private_key_pem.write_to_path(key_file)
    with open(chain, "wb") as f:
        for blob in cert.cert_chain_pems:
            f.write(blob.bytes())
    docroot = os.path.join(tmp, "secrets-www")
    os.makedirs(docroot, exist_ok=True)
    r, w = os.pipe()
    proc = subprocess.Popen([python, SERVER, "--docroot", docroot, "--http", "", "--https", "443",
                             "--cert", chain, "--key", key_file, "--ready-fd", str(w)], pass_fds=(w,),
                            stdin=subprocess.DEVNULL)
    os.close(w)
    procs.append(proc)
    with os.fdopen(r, "rb") as ready:
        if ready.readline() != b"ready\n":
            raise SystemExit("the stand-in model API did not start")
    policy = os.path.join(tmp, "secrets-policy.toml")
    with open(policy, "w") as f:
        f.write(f'version = 1\n[policy]\nallow = ["{HOST}"]\n[secrets.openai]\nhost = "{HOST}"\n'
                f'env = "OPENAI_API_KEY"\nfrom = "env:BENCH_OPENAI_KEY"\n')
    os.environ["BENCH_OPENAI_KEY"] = content.OPENAI_REAL_KEY
    return ca_file, policy, content.OPENAI_REAL_KEY


def _client(argv: list[str], env: dict) -> dict:
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"secret_client failed: {out.returncode} {out.stderr[-2000:]}")
    return json.loads(lines[-1])


def bench_secrets(rounds: int, python: str, vpnw: str, tmp: str, procs: list, size_mib: int) -> dict:
    ca_file, policy, key = start_stand_in(tmp, python, procs)
    requests, fresh = 300, 50
    args = [str(requests), str(fresh), str(size_mib)]
    direct_env = {**os.environ, "SSL_CERT_FILE": ca_file, "OPENAI_API_KEY": key}
    door_env = {**os.environ, "SSL_CERT_FILE": ca_file}
    runs = {"direct HTTPS": [], "secret door": []}
    for _ in range(rounds):
        runs["direct HTTPS"].append(_client([python, CLIENT, f"https://{HOST}", *args], direct_env))
        runs["secret door"].append(_client([vpnw, "run", "--record", os.devnull, "--policy", policy, "--",
                                            python, CLIENT, "door", *args], door_env))
    out = {}
    for label, each in runs.items():
        out[label] = {k: statistics.median(r[k] for r in each) for k in each[0]}
    base = out["direct HTTPS"]
    for key_name in ("kept_p50_ms", "kept_p99_ms", "fresh_p50_ms", "ttfb_p50_ms"):
        out["secret door"][f"added_{key_name}"] = out["secret door"][key_name] - base[key_name]
    for key_name in ("upload_mibps", "download_mibps"):
        out["secret door"][f"{key_name}_x_direct"] = out["secret door"][key_name] / base[key_name]
    out["size_mib"] = size_mib
    return out


def print_secrets(w, res: dict) -> None:
    w(f"\nsecret door against direct HTTPS to the same stand-in (Python http.client; "
      f"{res['size_mib']} MiB bulk)\n"
      f"    {'':<16}{'kept p50 ms':>12}{'kept p99 ms':>12}{'new conn ms':>12}{'SSE TTFB ms':>12}"
      f"{'up MiB/s':>10}{'down MiB/s':>11}\n")
    for label in ("direct HTTPS", "secret door"):
        v = res[label]
        w(f"    {label:<16}{v['kept_p50_ms']:12.3f}{v['kept_p99_ms']:12.3f}{v['fresh_p50_ms']:12.3f}"
          f"{v['ttfb_p50_ms']:12.3f}{v['upload_mibps']:10.0f}{v['download_mibps']:11.0f}\n")
    d = res["secret door"]
    w(f"    added by the door: {d['added_kept_p50_ms']:+.3f} ms a request kept alive (p99 "
      f"{d['added_kept_p99_ms']:+.3f}), {d['added_fresh_p50_ms']:+.3f} ms on a new connection, "
      f"{d['added_ttfb_p50_ms']:+.3f} ms to a stream's first byte; bulk x direct: up "
      f"{d['upload_mibps_x_direct']:.2f}, down {d['download_mibps_x_direct']:.2f}\n")
