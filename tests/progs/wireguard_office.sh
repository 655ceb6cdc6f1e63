# Run by tests/wg_support.py (sh -c, in the office's network namespace, in a
# mount namespace of its own): the office's WireGuard peer (wireguard-go), its
# DNS server (dnsmasq) and its web servers, until killed. Everything it needs
# comes in the environment: the WG_* variables wg_support.py sets.
set -e
mount -t tmpfs tmpfs /run && mkdir /run/wireguard
WG_PROCESS_FOREGROUND=1 LOG_LEVEL=error setpriv --pdeathsig KILL -- wireguard-go wgo &
for i in $(seq 200); do [ -S /run/wireguard/wgo.sock ] && break; sleep 0.02; done
wg set wgo private-key "$WG_DIR/peer.key" listen-port 51820 \
    peer "$WG_OUR_PUBLIC" allowed-ips "$WG_OUR_TUNNEL/32" \
    peer "$WG_BENCH_PUBLIC" allowed-ips "$WG_BENCH_TUNNEL/32"
ip address add "$WG_PEER_TUNNEL/24" dev wgo
ip link set wgo up
setpriv --pdeathsig KILL -- dnsmasq --keep-in-foreground --conf-file=/dev/null --pid-file \
    --user=root --group=root --listen-address="$WG_PEER_TUNNEL" --bind-interfaces --port=53 \
    --no-resolv --no-hosts --no-poll --address="/$WG_INTERNAL/$WG_PEER_TUNNEL" \
    --address="/$WG_CORP/$WG_PEER_TUNNEL" --address="/$WG_WEB/$WG_PEER_TUNNEL" --local=/#/ \
    --log-queries --log-facility="$WG_DIR/dns.log" &
setpriv --pdeathsig KILL -- "$WG_PYTHON" "$WG_SERVERS/http_server.py" --docroot "$WG_DOCROOT" \
    --http 80 --https 443 --cert "$WG_CERT" --key "$WG_KEY" \
    --log "$WG_DIR/world-web.log" >/dev/null 2>&1 &
setpriv --pdeathsig KILL -- python3 -m http.server --bind "$WG_PEER_TUNNEL" --directory "$WG_DIR/www" "$WG_WEB_PORT" >/dev/null 2>"$WG_LOG" &
wait
