#!/usr/bin/env bash
# Debian packages the tests need (run by `make test`; needs root, as on CI and course machines).
# Each feature adds its packages to PACKAGES with a comment saying which tests use them.
set -euo pipefail
PACKAGES=(
  # tests/runtime/test_slurm.py: a real two-node Slurm cluster on localhost (scripts/slurm_cluster.py)
  # runs Debian's slurmctld + two slurmd (slurm-wlm) authenticated by munge.
  slurm-wlm
  munge
  # tests/book/test_book.py: the built book is read in headless Chromium, driven by Playwright
  # through executable_path (tests/book/book_browser.py); Playwright never downloads a browser here.
  chromium
  # tests/hub/test_hub.py and `make hub`: git daemon serves the course repository to the servers.
  git
  # tests/grade/test_gradebook_server.py: a private PostgreSQL server for the gradebook
  # (scripts/postgres_server.py runs Debian's initdb and postgres as `nobody` in a test folder).
  postgresql
  # tests/grade/test_sandbox.py and every autograde: student code runs inside bubblewrap's
  # namespaces (src/distlab/grade/boundary/bubblewrap.py).
  bubblewrap
)
# The course hub's proxy (configurable-http-proxy) comes from npm: Node.js and npm, Debian's
# unless the machine already has them (e.g. from NodeSource, whose nodejs includes npm).
if ! command -v npm >/dev/null; then PACKAGES+=(nodejs npm); fi
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "error: the tests need these Debian packages: ${missing[*]} (run as root, or apt-get install them)" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
