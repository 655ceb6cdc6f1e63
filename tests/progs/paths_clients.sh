# Run by tests/test_e2e_paths.py: curl, Python and git through the run's exit.
# argv: the CA file, a work directory, "yes" when the exit resolves names
# (then the internal host too), the Python to run, the internal host.
set -e
ca=$1; work=$2; internal=$3; python=$4; internal_host=$5
curl -sS --max-time 20 http://api.github.com/whoami; echo
curl -sS --max-time 20 --cacert "$ca" https://api.github.com/whoami; echo
curl -sS --max-time 20 --socks5-hostname 127.0.0.1:1080 http://github.com/whoami; echo
"$python" - "$ca" <<'EOF'
import ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[1])
for url in ("http://files.pythonhosted.org/whoami", "https://files.pythonhosted.org/whoami"):
    with urllib.request.urlopen(url, context=ctx, timeout=20) as resp:
        print(resp.read().decode().strip())
EOF
git clone -q http://git.world/repo.git "$work/repo"
echo "README: $(cat "$work/repo/README")"
if [ "$internal" = yes ]; then
    curl -sS --max-time 20 http://$internal_host/whoami; echo
    curl -sS --max-time 20 --socks5-hostname 127.0.0.1:1080 http://$internal_host/whoami; echo
fi
