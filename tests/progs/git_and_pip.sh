# Run by tests/test_e2e_files.py (sh -c, in the work directory): git commits
# and pip installs in the writable tree, then tries the key and the global git
# config. argv: the Python to make the venv with, the package to install.
set -e
git init -q repo && cd repo
echo hello > f && git add f
git -c user.name=agent -c user.email=agent@example.invalid commit -q -m one
git log --format=%s
cd ..
"$1" -m venv --without-pip --system-site-packages venv
venv/bin/python -m pip install -q --no-cache-dir --index-url http://pypi.world/simple --trusted-host pypi.world "$2"
venv/bin/python -c 'import vpnw_demo_pkg; print(vpnw_demo_pkg.VALUE)'
if cat ~/.ssh/id_ed25519; then echo KEY-READ; fi
ls -A ~/.ssh | wc -l
if git config --global user.name someone; then echo GLOBAL-WRITTEN; fi
