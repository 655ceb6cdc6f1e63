"""scripts/bench/run --against REV: the pure part that sets each figure of
this tree beside REV's (compare_against), for every section."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCH)
    try:
        spec = importlib.util.spec_from_file_location("bench_all", os.path.join(BENCH, "all.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_all"] = module
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(BENCH)
        sys.modules.pop("bench_all", None)


def _bulk(gbps, handshake_ms, tunnel_gbps):
    return {"gbps": gbps, "handshake_ms": handshake_ms, "tunnel_gbps": tunnel_gbps}


def _leak(pss_held, fds):
    return {"vpnw_pss_mib": {"held": pss_held}, "vpnw_fds": dict(zip(("before", "held", "after"), fds))}


def test_every_section_has_its_rows_beside_rev(bench):
    rev = "abc1234"
    res = {
        "startup": {"over_ms": {"signed": 100.0}, "against": {rev: {"over_ms": {"signed": 200.0}}}},
        "bulk": {"direct": _bulk(2.0, 1.0, 2.0), "vpnw http": _bulk(1.8, 5.0, 1.9),
                 f"vpnw http @{rev}": _bulk(1.2, 100.0, 1.8)},
        "capture": {
            "lat": {"direct": {"p50_ms": 0.1}, "vpnw socks5": {"p50_ms": 0.3},
                    f"vpnw socks5 @{rev}": {"p50_ms": 0.5}, "vpnw capture door": {"p50_ms": 0.2},
                    f"vpnw capture door @{rev}": {"p50_ms": 0.3}},
            "conns": {"direct": {"rate": 5000}, "vpnw socks5": {"rate": 2000},
                      f"vpnw socks5 @{rev}": {"rate": 1000}, "vpnw capture door": {"rate": 2400},
                      f"vpnw capture door @{rev}": {"rate": 1200}},
            "dns": {"qps": 9000.0}, "startup": {"over_ms": 4.0},
            "setup_ms": {"install_ms": 3.0, "resolv_ms": 1.0},
            "against": {rev: {"dns": {"qps": 6000.0}, "startup": {"over_ms": 8.0},
                              "setup_ms": {"install_ms": 6.0, "resolv_ms": 1.0}}}},
        "leak": {**_leak(40.0, (20, 2020, 20)), "against": {rev: _leak(50.0, (20, 2020, 21))}},
    }
    rows = {(r["section"], r["row"]): r for r in bench.compare_against(res, rev)}
    assert rows[("startup", "vpnw run -- true, over true (signed)")]["ratio"] == pytest.approx(0.5)
    assert rows[("bulk", "vpnw http")]["ratio"] == pytest.approx(1.5)
    assert rows[("bulk", "vpnw http, connect")]["ratio"] == pytest.approx(0.05)
    assert rows[("bulk", "vpnw http, after connect")]["new"] == 1.9
    assert rows[("capture", "vpnw capture door, added p50")]["ratio"] == pytest.approx(0.5)
    assert rows[("capture", "vpnw capture door, conn/s")]["ratio"] == pytest.approx(2.0)
    assert rows[("capture", "vpnw socks5, conn/s")]["ratio"] == pytest.approx(2.0)
    assert rows[("capture", "DNS door answers/s")]["ratio"] == pytest.approx(1.5)
    assert rows[("capture", "run --capture -- true, over run -- true")]["ratio"] == pytest.approx(0.5)
    assert rows[("capture", "helper alone: install")]["ratio"] == pytest.approx(0.5)
    assert rows[("leak", "PSS of vpnw's own, tunnels held")]["ratio"] == pytest.approx(0.8)
    assert rows[("leak", "open fds after - before")]["new"] == 0
    assert rows[("leak", "open fds after - before")]["old"] == 1


def test_a_rev_without_capture_leaves_the_capture_rows_out(bench):
    res = {"capture": {"lat": {"direct": {"p50_ms": 0.1}}, "conns": {}, "dns": {"qps": 1.0},
                       "startup": {"over_ms": 1.0}, "setup_ms": {"install_ms": 1.0, "resolv_ms": 1.0},
                       "against": {}, "without_capture": ["old"]}}
    assert bench.compare_against(res, "old") == []


def test_startup_compares_each_stages_cpu_beside_rev(bench, tmp_path):
    rev = "abc1234"
    res = {"startup": {"over_ms": {"signed": 100.0},
                       "cpu_ms": {"signed": {"vpnw": 90.0, "recorder": 30.0}},
                       "against": {rev: {"over_ms": {"signed": 200.0},
                                         "cpu_ms": {"signed": {"vpnw": 100.0}}}}}}
    rows = {(r["section"], r["row"]): r for r in bench.compare_against(res, rev)}
    assert rows[("startup", "CPU of vpnw (signed)")]["ratio"] == pytest.approx(0.9)
    assert ("startup", "CPU of recorder (signed)") not in rows     # REV's trace has no such mark
    # A REV whose trace lines carry no CPU column (before it came in) gives no marks, not an error.
    trace = tmp_path / "old.trace"
    trace.write_text("1000000 42 vpnw interpreter up\n")
    assert bench.read_trace(str(trace), 0) == {}
    trace.write_text("1000000 42 1500 vpnw helper forked\n3000000 42 9000 vpnw exit\n")
    assert bench.read_trace(str(trace), 0)["cpu: vpnw until the helper forked"] == 1.5
    assert bench.read_trace(str(trace), 0)["cpu: vpnw"] == 9.0
    # vpnw's part of the start, comparable whenever its helper forks: until the recorder's fork.
    trace.write_text("1000000 42 1500 vpnw helper forked\n2000000 42 4000 vpnw recorder forked\n")
    assert bench.read_trace(str(trace), 0)["cpu: vpnw until the recorder forked"] == 4.0


def _run(gbps, seconds, handshake_s, size=1 << 30):
    return {"gbps": gbps, "seconds": seconds, "handshake_s": handshake_s, "bytes": size}


def test_bulk_sets_curl_rows_beside_curl_direct_and_judges_curls_only(bench):
    """curl's download is issue 33's tunnel line (0.9x direct): its rows are
    judged. netload's upload is shown beside them: direct, it is faster than
    any relay here. Failed before: netload's rows were judged, curl's not."""
    rev = "abc1234"
    runs = {"direct": [_run(2.0, 0.5, 0.0)], "vpnw http": [_run(1.6, 0.6, 0.1)],
            "direct (curl)": [_run(0.5, 2.0, 0.0)], "vpnw http (curl)": [_run(0.45, 2.2, 0.2)],
            f"vpnw http @{rev} (curl)": [_run(0.4, 2.4, 0.4)]}
    out = bench.bulk_figures(runs)
    # each client beside direct measured by that same client
    assert out["vpnw http"]["x_direct"] == pytest.approx(0.8)
    assert out["vpnw http (curl)"]["x_direct"] == pytest.approx(0.9)
    assert out["vpnw http (curl)"]["tunnel_x_direct"] == pytest.approx(1.0)
    assert out["vpnw http (curl)"]["handshake_ms"] == pytest.approx(200.0)
    judged = [v for v in bench.judge({"bulk": out}) if v["section"] == "bulk"]
    assert [(v["row"], v["ok"]) for v in judged] == [("vpnw http (curl)", True)]
    assert judged[0]["target"] == ">= 0.9x direct"
    out["vpnw http (curl)"]["x_direct"] = 0.89
    assert [v["ok"] for v in bench.judge({"bulk": out}) if v["section"] == "bulk"] == [False]
    rows = {(r["section"], r["row"]): r for r in bench.compare_against({"bulk": out}, rev)}
    assert rows[("bulk", "vpnw http (curl)")]["ratio"] == pytest.approx(0.45 / 0.4)
    assert rows[("bulk", "vpnw http (curl), connect")]["ratio"] == pytest.approx(0.5)


def test_bulk_sets_each_row_beside_the_reference_relay_of_its_client(bench):
    """The bound beside vpnw: each row over the C splice relay measured by the
    same client; the relay itself is neither judged nor set beside REV."""
    rev = "abc1234"
    ref = bench.REFERENCE
    runs = {"direct": [_run(2.0, 0.5, 0.0)], ref: [_run(1.5, 0.6, 0.0)],
            "vpnw http": [_run(1.2, 0.7, 0.1)], f"vpnw http @{rev}": [_run(1.0, 0.8, 0.1)],
            "direct (curl)": [_run(0.5, 2.0, 0.0)], ref + " (curl)": [_run(0.4, 2.2, 0.0)],
            "vpnw http (curl)": [_run(0.36, 2.4, 0.2)]}
    out = bench.bulk_figures(runs)
    assert out[ref]["x_direct"] == pytest.approx(0.75)
    assert out[ref]["x_reference"] == pytest.approx(1.0)
    assert out["vpnw http"]["x_reference"] == pytest.approx(0.8)
    assert out["vpnw http (curl)"]["x_reference"] == pytest.approx(0.9)
    assert [v["row"] for v in bench.judge({"bulk": out}) if v["section"] == "bulk"] == ["vpnw http (curl)"]
    assert not [r for r in bench.compare_against({"bulk": out}, rev) if ref in r["row"]]
    assert bench.bulk_note(out).endswith(f"{ref} 0.75x direct is its bound")
    # Without the relay (no gcc) the rows carry no such ratio.
    del runs[ref], runs[ref + " (curl)"]
    assert bench.bulk_figures(runs)["vpnw http"]["x_reference"] is None
    assert "bound" not in bench.bulk_note(bench.bulk_figures(runs))


def test_reference_relay_way_connects_to_the_relay_in_front_of_each_server(bench):
    way = bench.Way(bench.REFERENCE, via=bench.RELAY_PORTS)
    assert way.kind == "direct" and way.door_args() == []
    assert way.server_port(bench.SINK_PORT) == bench.RELAY_PORTS[0]
    assert way.server_port(bench.NGINX_PORT) == bench.RELAY_PORTS[1]
    assert bench.DIRECT.server_port(bench.SINK_PORT) == bench.SINK_PORT


def test_the_budget_says_which_marks_only_some_runs_have(bench):
    """A mark only some runs reach (vpnw reads the broker's status to its end
    only when that end comes before vpnw is done) has the median of those
    runs alone, so its place in the budget is no order: the budget says in
    how many runs it is. Before, "vpnw: broker's status ended" stood after
    vpnw's exit with nothing to say so."""
    runs = [{"vpnw: go": 10.0, "vpnw: exit": 20.0}] * 9 + \
        [{"vpnw: go": 10.0, "vpnw: exit": 20.0, "vpnw: broker's status ended": 25.0}] * 3
    s = {"true_ms": 1.0, "over_ms": {"signed": 19.0}, "against": {},
         "timeline_ms": {"signed": bench._median_marks(runs)},
         "timeline_runs": {"signed": bench._runs_with(runs)}}
    out = []
    bench.print_startup(out.append, s, "MISSED")
    text = "".join(out)
    assert "  vpnw: broker's status ended  (in 3 of 12 runs)\n" in text
    assert "  vpnw: exit\n" in text and "  vpnw: go\n" in text
