"""What a pip user meets first: ``--version``, ``python -m smoe``, a light ``import smoe``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from smoe import __version__

DUMP = "import sys; from smoe.cli import dump_main; sys.exit(dump_main(sys.argv[1:]))"


def test_version_flag_of_both_commands() -> None:
    for command, prog in (
        ([sys.executable, "-m", "smoe"], "smoe"),
        ([sys.executable, "-c", DUMP], "smoe-dump"),
    ):
        proc = subprocess.run([*command, "--version"], capture_output=True, text=True)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{prog} {__version__}\n", "")


def test_python_dash_m_smoe_is_the_smoe_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "smoe", "spec", "--json"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert '"page_size": 16384' in proc.stdout
    usage = subprocess.run([sys.executable, "-m", "smoe"], capture_output=True, text=True)
    assert usage.returncode == 2 and usage.stderr.startswith("error: ")
    assert "(see smoe --help)" in usage.stderr


def test_import_smoe_is_light_and_vault_is_lazy() -> None:
    code = (
        "import sys, smoe; light = 'numpy' not in sys.modules; "
        "from smoe import Vault; from smoe.vault.reader import Vault as V; "
        "print(light, Vault is V, 'Vault' in dir(smoe))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.split() == ["True", "True", "True"], proc.stderr
    missing = subprocess.run(
        [sys.executable, "-c", "import smoe; smoe.Nothing"], capture_output=True, text=True
    )
    assert "AttributeError: module 'smoe' has no attribute 'Nothing'" in missing.stderr


def test_spec_ksy_prints_the_shipped_spec() -> None:
    """`smoe spec --ksy` prints the .ksy the package ships, identical to spec/smoe.ksy."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "smoe", "spec", "--ksy"], capture_output=True, text=True, check=True
    )
    assert proc.stdout == (root / "spec" / "smoe.ksy").read_text(encoding="utf-8")
