"""Run by tests/test_ci_support.py."""
import pytest
from ci_support import cannot, needs

@pytest.fixture(scope="module")
def package():
    pytest.skip("the package could not be installed")

@pytest.mark.readme_table
def test_table_skip_in_the_test():
    pytest.skip("chromium is not installed")

@pytest.mark.readme_table
@pytest.mark.skipif(True, reason="no java here")
def test_table_skipif():
    pass

@pytest.mark.readme_table
def test_table_skip_in_a_fixture(package):
    pass

def test_other_skip():
    pytest.skip("legacy_tiocsti is 0")

def test_cannot_outside_the_table():
    cannot("tmux is missing")

@needs(True, "minisign is not installed")
def test_needs_what_is_missing():
    pass

@needs(False, "node is not installed")
def test_needs_what_is_there():
    pass
