"""Codecs of protocols from outside vpnw (SOCKS5 and HTTP proxy clients,
DNS, the TLS ClientHello): sans-I/O, shared by the stages that speak them."""
