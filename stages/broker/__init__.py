"""The broker stage: takes the connections the helper hands over, decides each
with the policy, dials through the path, relays the bytes and records every
step. Entry: `main.main_from_fds`."""
