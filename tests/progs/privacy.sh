# Run by tests/test_e2e_record.py. Every place a secret can ride: argv,
# environment, URL path and query, an Authorization header, a cookie, a
# request body; over both doors and both kinds of HTTP request.
set -e
secret="$1"
curl -sS --max-time 30 -o /dev/null -H "Authorization: Bearer $secret" -b "session=$secret" \
     --data "token=$SECRET_TOKEN" "http://api.github.com/upload/$secret?q=$secret"
curl -sS --max-time 30 -o /dev/null --cacert "$CA" -H "Authorization: Bearer $secret" \
     "https://api.github.com/whoami/$secret?q=$secret"
curl -sS --max-time 30 -o /dev/null --socks5-hostname 127.0.0.1:1080 -b "c=$secret" \
     "http://files.pythonhosted.org/bytes/10?seed=$secret"
echo done
