"""The broker answers names in /etc/hosts itself (no getaddrinfo thread),
only when the name service reads files first, and reads the file again when
it changes."""
from __future__ import annotations

import os
from ipaddress import ip_address

from stages.broker.hosts_file import HostsFile, files_first, parse_hosts


def test_parse_hosts_keeps_every_address_of_a_name_in_file_order():
    text = ("# comment\n127.0.0.1 localhost\n10.0.0.5  Bench.test alias # trailing\n"
            "::1 localhost ip6-localhost\n10.0.0.6 bench.test.\nnot-an-address name\n"
            "fe80::1%eth0 linklocal\n10.0.0.5 bench.test\n\n   \n")
    names = parse_hosts(text)
    assert names["bench.test"] == (ip_address("10.0.0.5"), ip_address("10.0.0.6"))
    assert names["alias"] == (ip_address("10.0.0.5"),)
    assert names["localhost"] == (ip_address("127.0.0.1"), ip_address("::1"))
    assert "name" not in names and "linklocal" not in names


def test_only_a_name_service_that_reads_files_first_is_followed():
    assert files_first("passwd: files\nhosts:          files dns\n")
    assert files_first("hosts: files mdns4_minimal [NOTFOUND=return] dns")
    assert not files_first("hosts: dns files\n")
    assert not files_first("hosts: resolve [!UNAVAIL=return] files\n")
    assert not files_first("# hosts: files\n")
    assert not files_first("")


def test_the_file_is_read_again_when_it_changes(tmp_path):
    hosts, nss = tmp_path / "hosts", tmp_path / "nsswitch.conf"
    nss.write_text("hosts: files dns\n")
    hosts.write_text("10.1.1.1 one.test\n")
    now = [100.0]
    f = HostsFile(str(hosts), str(nss), clock=lambda: now[0])
    assert f.lookup("one.test") == (ip_address("10.1.1.1"),)
    assert f.texts("one.test") == ["10.1.1.1"]
    assert f.lookup("two.test") == ()
    hosts.write_text("10.1.1.1 one.test\n10.2.2.2 two.test\n")
    os.utime(hosts, ns=(1, 1))   # a new stamp even within the clock's resolution
    # Within a second of the last look the file is not looked at again...
    now[0] += 0.5
    assert f.lookup("two.test") == ()
    # ...after it, the change is seen.
    now[0] += 0.5
    assert f.lookup("two.test") == (ip_address("10.2.2.2"),)
    assert f.texts("two.test") == ["10.2.2.2"]
    hosts.unlink()
    now[0] += 1.0
    assert f.lookup("one.test") == ()
    assert f.texts("one.test") == []


def test_a_dns_first_machine_never_uses_the_file(tmp_path):
    hosts, nss = tmp_path / "hosts", tmp_path / "nsswitch.conf"
    nss.write_text("hosts: dns files\n")
    hosts.write_text("10.1.1.1 one.test\n")
    assert HostsFile(str(hosts), str(nss)).lookup("one.test") == ()
    assert HostsFile(str(hosts), str(tmp_path / "missing")).lookup("one.test") == ()
