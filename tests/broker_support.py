"""For the broker's own tests, whose origins listen on this machine's loopback."""

# `python -m stages.broker` with step 4 (the machine itself, decide.py) left
# out: the broker in the child process reaches the test's origins on this
# machine's loopback, which vpnw never dials (conftest.origins_on_loopback
# does the same for a broker in the test's own process).
BROKER_REACHING_LOOPBACK = ["-c", "import runpy, stages.broker.connector as c; c.MACHINE_STEP = False; "
                                  "runpy.run_module('stages.broker', run_name='__main__', alter_sys=True)"]
