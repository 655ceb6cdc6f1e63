"""The WireGuard path: the broker's dialer, the path namespace process that
runs wireguard-go, and the DNS it asks through the tunnel."""
