"""Run by tests/test_helper_without_re.py."""
# ruff: noqa: E402 (when each module loads is what the test looks at)
import os
import sys
from stages.orchestrator import main, helper_first, run_command, options  # noqa: F401 (loaded, as vpnw has it here)
from stages.helper import main as helper_main, seal, seccomp_cache, capture  # noqa: F401
from stages.helper.supervisor import launch, shell  # noqa: F401
from stages.helper import netlink, file_mounts, seccomp_rules  # noqa: F401
from stages.config import client_env
from stages.kernel import mounts
from stages.wire import status as st
client_env.apply(dict(os.environ, JAVA_TOOL_OPTIONS="-Xmx1g"), python=sys.executable)
mounts.mount_points_under("/sys")
st.decode(st.encode(st.InitOk()), st.INIT_REPORT)
st.read_json('[{"metainfo": {"json_schema_version": 1}}]')
before = sorted(sys.modules)
import stages.config.policy  # noqa: F401 (what it loads is what the test looks at)
print(before)
print(sorted(sys.modules))
