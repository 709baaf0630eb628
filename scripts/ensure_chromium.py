"""Make sure Debian's Chromium is installed for the HTML report's browser test.

tox -e tests runs this before pytest: on a fresh Debian/Ubuntu machine (as root, or with
passwordless sudo) it installs the ``chromium`` package; elsewhere it says what to do
and fails, so the browser test never silently skips in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

PACKAGES = ("chromium", "fonts-dejavu-core")


def _apt(prefix: list[str]) -> int:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    update = subprocess.run([*prefix, "apt-get", "update", "-qq"], env=env, check=False)
    if update.returncode != 0:
        return update.returncode
    install = [*prefix, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    return subprocess.run(install, env=env, check=False).returncode


def main() -> int:
    found = shutil.which("chromium")
    if found:
        print(f"chromium: {found}")
        return 0
    if shutil.which("apt-get") is None:
        print(
            "chromium is missing and this is not a Debian-like system: install Chromium "
            "and put it on PATH as 'chromium'",
            file=sys.stderr,
        )
        return 1
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    print("installing Debian's chromium for the HTML report test ...", flush=True)
    if _apt(prefix) != 0 or shutil.which("chromium") is None:
        print(
            "could not install chromium: run 'sudo apt-get install chromium' and retry",
            file=sys.stderr,
        )
        return 1
    print(f"chromium: {shutil.which('chromium')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
