"""What can be checked of docker/ without a Docker engine: the image installs the README's way,
and no database URL in it carries a password."""

from __future__ import annotations

import re
import subprocess

from helpers import REPO

DOCKER = REPO / "docker"


def test_the_image_installs_with_the_readmes_bootstrap():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "RUN scripts/bootstrap.sh" in dockerfile
    for target in ("study", "test"):  # the README's two commands set up through it too
        planned = subprocess.run(["make", "-n", "-C", str(REPO), target], capture_output=True, text=True)
        assert planned.returncode == 0 and "scripts/bootstrap.sh" in planned.stdout, planned.stderr
    for copied in re.findall(r"^COPY (\S+)", dockerfile, flags=re.M):
        assert (REPO / copied).exists(), copied


def test_compose_runs_the_cluster_and_keeps_passwords_out_of_urls():
    compose = (DOCKER / "compose.yaml").read_text()
    for service in ("postgres:", "ray-head:", "ray-worker:", "dashboard:", "driver:"):
        assert f"\n  {service}" in compose
    urls = re.findall(r"[a-z+]+://\S+", compose)
    assert urls and all(not re.match(r"[a-z+]+://[^/@\s]+:[^/@\s]+@", u) for u in urls)
    assert "PGPASSWORD" in compose and "--ray-address" in compose
