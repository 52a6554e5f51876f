"""What a pip user meets first: ``--version``, ``python -m smoe``, a light ``import smoe``."""

from __future__ import annotations

from smoe import __version__

from fixtures_data import ROOT
from helpers import SMOE, SMOE_DUMP, python, run


def test_version_flag_of_both_commands() -> None:
    for command, prog in ((SMOE, "smoe"), (SMOE_DUMP, "smoe-dump")):
        proc = run("--version", command=command)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{prog} {__version__}\n", "")


def test_python_dash_m_smoe_is_the_smoe_command() -> None:
    proc = run("spec", "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"page_size": 16384' in proc.stdout
    usage = run()
    assert usage.returncode == 2 and usage.stderr.startswith("error: ")
    assert "(see smoe --help)" in usage.stderr


def test_import_smoe_is_light_and_vault_is_lazy() -> None:
    code = (
        "import sys, smoe; light = 'numpy' not in sys.modules; "
        "from smoe import Vault; from smoe.vault.reader import Vault as V; "
        "print(light, Vault is V, 'Vault' in dir(smoe))"
    )
    proc = python(code)
    assert proc.stdout.split() == ["True", "True", "True"], proc.stderr
    missing = python("import smoe; smoe.Nothing")
    assert "AttributeError: module 'smoe' has no attribute 'Nothing'" in missing.stderr


def test_spec_ksy_prints_the_shipped_spec() -> None:
    """`smoe spec --ksy` prints the .ksy the package ships, identical to spec/smoe.ksy."""
    proc = run("spec", "--ksy")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (ROOT / "spec" / "smoe.ksy").read_text(encoding="utf-8")
