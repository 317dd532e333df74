"""The wheel a plant server installs: deploy/build-wheelhouse.sh builds it (manylinux,
stripped) with a wheelhouse of its runtime dependencies; a fresh venv installs from that
folder alone (`pip install --no-index --find-links …`, as docs/operations.md says) and
runs `sfc-host` from a folder outside the source tree.

Built once per module (about a minute and a half on two cores, pip's cache reused);
needs a C compiler and the package index, as CI has."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "build-wheelhouse.sh"
EXAMPLES = ["axle_fit_qa.json", "tighten_rework.json", "paint_hold_restart.json"]


def _env(**extra: str) -> dict[str, str]:
    """The environment without anything that points at the source tree or the project's
    venv, and with no pip configuration: the install sees the wheelhouse only."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def _run(cmd: list[str], cwd: Path, timeout: float = 120, **env: str
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(**env), text=True,
                          capture_output=True, timeout=timeout)


class Installed:
    def __init__(self, wheelhouse: Path, wheel: Path, venv_dir: Path, cwd: Path,
                 build_s: float, install_s: float) -> None:
        self.wheelhouse, self.wheel, self.venv, self.cwd = wheelhouse, wheel, venv_dir, cwd
        self.build_s, self.install_s = build_s, install_s

    def sfc_host(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run([self.venv / "bin" / "sfc-host", *args], self.cwd, timeout=60)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return _run([self.venv / "bin" / "python", "-c", code], self.cwd, timeout=60)


def _server_python() -> str:
    """The Python of the fresh venv: the distribution's python3 where it has the minor
    version of the one running the tests (Debian 12: 3.11.2 beside a 3.11.x that built
    the wheels, as on a plant server: its dependencies differ by markers), else this
    one."""
    system = "/usr/bin/python3"
    probe = "import ensurepip, sys, venv; print('%d.%d' % sys.version_info[:2])"
    if os.access(system, os.X_OK):
        r = subprocess.run([system, "-c", probe], capture_output=True, text=True, timeout=30)
        if r.returncode == 0 and r.stdout.strip() == "{}.{}".format(*sys.version_info[:2]):
            return system
    return sys.executable


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    wheelhouse = base / "wheelhouse"
    cwd = base / "elsewhere"            # no source tree below or above it
    cwd.mkdir()
    t0 = time.monotonic()
    # the Python that runs the tests, so the wheels match the venv made below
    r = _run(["bash", SCRIPT, wheelhouse], cwd, timeout=900, PYTHON=sys.executable)
    build_s = time.monotonic() - t0
    assert r.returncode == 0, f"build-wheelhouse.sh failed:\n{r.stdout}\n{r.stderr[-5000:]}"
    wheel = Path(r.stdout.strip().splitlines()[-1])
    assert wheel.is_file() and wheel.parent == wheelhouse, r.stdout

    t0 = time.monotonic()
    venv_dir = base / "venv"
    r = _run([_server_python(), "-m", "venv", venv_dir], cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    # the documented command; CC=false: a source build would fail, not quietly compile
    r = _run([venv_dir / "bin" / "python", "-m", "pip", "install", "--no-index",
              "--find-links", wheelhouse, "sfc-fast"], cwd, timeout=300, CC="false")
    assert r.returncode == 0, f"offline install failed:\n{r.stdout}\n{r.stderr}"
    install_s = time.monotonic() - t0
    return Installed(wheelhouse, wheel, venv_dir, cwd, build_s, install_s)


def test_wheel_is_manylinux_stripped_and_licensed(installed: Installed) -> None:
    name = installed.wheel.name
    assert "manylinux" in name and "linux_x86_64" not in name.replace("manylinux", ""), name
    with zipfile.ZipFile(installed.wheel) as z:
        names = z.namelist()
        sos = [n for n in names if n.endswith(".so")]
        assert len(sos) == len(list((REPO / "src" / "sfc_fast").rglob("*.pyx"))), sos
        for so in sos:
            data = z.read(so)
            assert b".debug_info" not in data and b".symtab" not in data, \
                f"{so} still has debug information or a symbol table"
        assert not [n for n in names if n.endswith((".c", ".pyx"))], "sources in the wheel"
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
        assert any(n.startswith("sfc_host/examples/") and n.endswith(".json") for n in names)
        # the web view's own script and stylesheet (no CDN: the pages need these)
        assert {"sfc_host/web/static/web.js", "sfc_host/web/static/web.css"} <= set(names)
        # the Lua scripts beside the store that loads them, the wire codecs' stubs, the
        # OPC UA face's Job Control NodeSet
        assert {"sfc_host/store/lua/cas.lua", "sfc_fast/wire/mqtt5.pyi", "sfc_fast/wire/otlp.pyi",
                "sfc_host/opcua/nodeset/opc.ua.isa95-jobcontrol.nodeset2.xml",
                "sfc_host/opcua_server/nodeset/Opc.Ua.NodeSet2.Base.xml"} <= set(names)
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        assert "License-Expression: Apache-2.0" in z.read(meta).decode()
    # stripped: the unstripped build was 5.8 MB
    assert installed.wheel.stat().st_size < 2_500_000, installed.wheel.stat().st_size
    # every file of the wheelhouse is checksummed, and the unit and settings are there
    sums = (installed.wheelhouse / "SHA256SUMS").read_text().split()
    files = [f.relative_to(installed.wheelhouse).as_posix()
             for f in installed.wheelhouse.rglob("*") if f.is_file()]
    assert sorted(sums[1::2]) == sorted(set(files) - {"SHA256SUMS"})
    assert (installed.wheelhouse / "sfc-host.service").is_file()
    assert (installed.wheelhouse / "host.toml").is_file()
    print(f"build {installed.build_s:.0f} s, venv and offline install "
          f"{installed.install_s:.0f} s: {name} {installed.wheel.stat().st_size} bytes")


def test_the_wheel_came_from_a_complete_sdist(installed: Installed) -> None:
    """The wheel is built from the sdist the script leaves in src/: it carries the
    Cython sources (not the generated C), deploy/, LICENSE and CHANGELOG.md."""
    (sdist,) = (installed.wheelhouse / "src").glob("sfc_fast-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    core = REPO / "src" / "sfc_fast"
    wanted = {f"src/sfc_fast/{p.name}" for p in core.iterdir()
              if p.suffix in (".pyx", ".pxd", ".pyi")}
    wanted |= {"LICENSE", "CHANGELOG.md", "deploy/build-wheelhouse.sh", "deploy/host.toml",
               "deploy/sfc-host.service"}
    assert sorted(wanted - names) == []
    assert not [n for n in names if n.endswith((".c", ".so"))]


def test_installed_package_is_the_wheels(installed: Installed) -> None:
    r = installed.python("import sfc_fast, sfc_host, sfc_fast.evolve; "
                         "print(sfc_fast.__file__); print(sfc_host.__file__)")
    assert r.returncode == 0, r.stderr
    for line in r.stdout.split():
        assert Path(line).is_relative_to(installed.venv), line
    # no RUNPATH of the build machine left in the extension modules
    readelf = shutil.which("readelf")
    if readelf:
        for so in (Path(r.stdout.split()[0]).parent).glob("*.so"):
            dyn = subprocess.run([readelf, "-d", str(so)], capture_output=True, text=True)
            assert "RPATH" not in dyn.stdout and "RUNPATH" not in dyn.stdout, so
    r = installed.python("import Cython")
    assert r.returncode != 0, "Cython came with the install"


def test_sfc_host_version(installed: Installed) -> None:
    if "version" not in installed.sfc_host("--help").stdout:
        pytest.skip("this sfc-host has no 'version' command yet")
    r = installed.sfc_host("version")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0." in r.stdout and "Traceback" not in r.stdout + r.stderr
    r = installed.sfc_host("--version")
    assert r.returncode == 0 and r.stdout.strip(), r.stdout + r.stderr


def test_recipe_check_on_the_packaged_examples(installed: Installed) -> None:
    r = installed.python("import sfc_host, pathlib; "
                         "print(pathlib.Path(sfc_host.__file__).parent / 'examples')")
    examples = Path(r.stdout.strip())
    assert examples.is_relative_to(installed.venv), examples
    files = [str(examples / n) for n in EXAMPLES]
    r = installed.sfc_host("recipe", "check", *files)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_run_check_with_the_shipped_settings(installed: Installed) -> None:
    if "--check" not in installed.sfc_host("run", "--help").stdout:
        pytest.skip("this sfc-host has no 'run --check' yet")
    r = installed.sfc_host("run", "--check", "--config",
                           str(installed.wheelhouse / "host.toml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
