"""The environment variables vpnw reads are checked like options
(stages/config/environment.py): a value vpnw cannot use is a message naming
the variable, the value and the fix; an empty value counts as unset."""
from __future__ import annotations

import pytest

from stages.config.environment import (
    EnvironmentProblem, broker_workers, check, handshake_timeout, state_home,
)


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "inf", "1e9", "3s"])
def test_a_handshake_timeout_that_is_not_seconds_is_refused(value):
    with pytest.raises(EnvironmentProblem) as exc:
        handshake_timeout({"VPNW_WG_HANDSHAKE_TIMEOUT": value})
    message = str(exc.value)
    assert message.startswith(f"VPNW_WG_HANDSHAKE_TIMEOUT={value!r}: ") and "fix: " in message


def test_handshake_timeout_values():
    assert handshake_timeout({}) == 8.0
    assert handshake_timeout({"VPNW_WG_HANDSHAKE_TIMEOUT": ""}) == 8.0
    assert handshake_timeout({"VPNW_WG_HANDSHAKE_TIMEOUT": "2.5"}) == 2.5


@pytest.mark.parametrize("value", ["two", "0", "-2", "1.5", "٣"])
def test_a_worker_count_that_is_not_a_count_is_refused(value):
    with pytest.raises(EnvironmentProblem, match=r"^VPNW_BROKER_WORKERS="):
        broker_workers({"VPNW_BROKER_WORKERS": value})


def test_worker_count_values():
    assert broker_workers({}) is None
    assert broker_workers({"VPNW_BROKER_WORKERS": "3"}) == 3


def test_state_home_must_be_absolute():
    assert state_home({"XDG_STATE_HOME": "/x/state"}) == "/x/state"
    assert state_home({}) is None
    with pytest.raises(EnvironmentProblem, match=r"^XDG_STATE_HOME='state': not an absolute path"):
        state_home({"XDG_STATE_HOME": "state"})


def test_check_names_the_first_problem():
    assert check({"VPNW_BROKER_WORKERS": "2", "PATH": "/bin"}) is None
    assert check({"VPNW_BROKER_WORKERS": "x"}).startswith("VPNW_BROKER_WORKERS='x'")
