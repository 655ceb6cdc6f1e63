# Run by tests/test_e2e_paths.py: a GET before the exit dies (then the file
# "ready"); once the file "go" is there, one GET through each door, tagged,
# and each curl's exit status. argv: a work directory, the CA file, the tag.
work=$1; ca=$2; tag=$3
curl -sS --max-time 20 http://api.github.com/whoami > "$work/before.json" || exit 10
touch "$work/ready"
while [ ! -e "$work/go" ]; do sleep 0.05; done
code=$(curl -sS --max-time 20 -o /dev/null -w '%{http_code}' "http://api.github.com/whoami?tag=$tag" 2>/dev/null)
echo "forward $? $code"
curl -sS --max-time 20 --cacert "$ca" "https://api.github.com/whoami?tag=$tag" >/dev/null 2>&1
echo "connect $?"
curl -sS --max-time 20 --socks5-hostname 127.0.0.1:1080 "http://api.github.com/whoami?tag=$tag" >/dev/null 2>&1
echo "socks $?"
exit 0
